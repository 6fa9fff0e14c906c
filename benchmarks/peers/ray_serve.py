"""Ray Serve as a peer: one deployment answering v2 JSON for every model, multiplexed.

Ray Serve has no model repository of its own: a user writes a deployment. The one here is
what its documentation suggests for many models behind one endpoint, model multiplexing
(``@serve.multiplexed``): every model is loaded on its first request into an LRU cache of
the replica, sized to hold the whole repository so that nothing is evicted during a run.

Ray picks a replica by the ``serve_multiplexed_model_id`` header, which a v2 client does not
send, so the deployment takes the model's name from the v2 path instead and hands it to the
multiplexed loader. With the one replica used here (two cores: Ray's GCS, raylet, HTTP proxy
and controller already take processes of their own) the header's replica affinity would
choose nothing, and the path keeps the request exactly the one every other peer gets.

The deployment is a plain ``__call__`` on Starlette's request, not a FastAPI ingress: Ray
Serve's own multiplexing example is written that way, and it spares FastAPI's routing and
validation, so the figures are Ray Serve's path (proxy, actor call, replica) at its leanest.

The process tree, all children of the launcher the caller holds the pid of::

    launcher (the Ray driver) -> gcs_server, monitors, raylet -> dashboard agent,
                                 runtime-env agent, Serve controller, HTTP proxy, replica

On SIGTERM or SIGINT the launcher calls ``serve.shutdown()`` and ``ray.shutdown()``, which
stop every one of them in a few seconds. Killed outright (SIGKILL), the launcher takes
gcs_server, the raylet and the workers along (Ray ties them to it with
``PR_SET_PDEATHSIG``) but not Ray's dashboard and runtime-env agents, which live on. So the
launcher runs in its own session and process group, whose id is its pid: after the
launcher has exited, ``os.killpg(pid, SIGKILL)`` (:func:`sweep`) removes any survivor and
is a no-op after a clean stop. A caller should always sweep: a SIGTERM that lands while
``ray.init`` runs (the first seconds) meets Ray's own handlers, which end the launcher
before it can shut Ray down, with the same two survivors. A terminal's Ctrl-C reaches only
the caller.

Smoke test (builds a repository, sets Ray up, serves, checks and measures, stops)::

    python benchmarks/peers/ray_serve.py --models 10
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.peers import CACHE, Peer, PeerUnavailable, Started

__all__ = ["PINS", "RayServePeer"]

#: What the peer's virtual environment holds. onnxruntime and numpy match the project's, so
#: that both sides run the same kernels.
PINS: tuple[str, ...] = ("ray[serve]==2.60.0", "onnxruntime==1.32.0", "numpy==2.4.6")

# pip's own time limit: resolving and downloading ray[serve] takes about a minute here.
_PIP_TIMEOUT_S = 1800.0
# Lines of pip's output a PeerUnavailable carries.
_PIP_TAIL_LINES = 15
_STAMP = "corral-peer-stamp.json"

_APP_MODULE = "corral_ray_serve_app"
_LAUNCHER = "corral_ray_serve_launch.py"
_LOG = "ray-serve.log"
#: The launcher writes Ray's session folder here (under this name, spelled out in it), for
#: finding what outlives a stop.
SESSION_FILE = "ray-session-dir"

# Ray's unix sockets live under its temporary folder, and a socket path is at most 107
# bytes; a session folder's name and ``sockets/plasma_store`` take about 64 of them.
_MAX_RAY_TEMP_DIR = 40

# The deployment, written into the work folder and imported by the launcher (and by Ray's
# workers, through PYTHONPATH). A build function rather than a module-level class, because
# ``max_num_models_per_replica`` is fixed when the class is decorated and depends on the
# repository.
_APP_SOURCE = '''\
"""KServe v2 JSON for every model of a Triton-layout repository, on Ray Serve multiplexing.

Written by benchmarks/peers/ray_serve.py; see its docstring for why it looks like this.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

_INFER_PATH = re.compile(r"^/v2/models/([^/]+)(?:/versions/[^/]+)?/infer$")
_HEALTH_PATHS = frozenset({"/v2/health/ready", "/v2/health/live"})


def find_models(repository: Path) -> dict[str, str]:
    """``{name: model.onnx}``, each model at its highest numeric version, as Triton picks."""
    models = {}
    for folder in sorted(path for path in repository.iterdir() if path.is_dir()):
        versions = [
            version
            for version in folder.iterdir()
            if version.name.isdigit() and (version / "model.onnx").is_file()
        ]
        if versions:
            newest = max(versions, key=lambda version: int(version.name))
            models[folder.name] = str(newest / "model.onnx")
    return models


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _open_session(path: str) -> Any:
    options = ort.SessionOptions()
    # One thread per run, like every other peer: the calling thread does the work.
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return ort.InferenceSession(path, sess_options=options, providers=["CPUExecutionProvider"])


def build_app(repository: str) -> Any:
    """The bound application serving every model under ``repository``."""
    models = find_models(Path(repository))
    if not models:
        raise ValueError(f"no model.onnx under {repository}")

    @serve.deployment(name="v2-models", num_replicas=1)
    class V2Models:
        def __init__(self, paths: dict[str, str]) -> None:
            self._paths = paths

        # Room for every model: evicting would measure reloads, not serving.
        @serve.multiplexed(max_num_models_per_replica=len(models))
        async def session(self, name: str) -> Any:
            # Tiny models load in a millisecond; Ray's own examples load on the loop too.
            return _open_session(self._paths[name])

        async def __call__(self, request: Request) -> Response:
            path = request.url.path
            if path in _HEALTH_PATHS:
                return Response(status_code=200)
            match = _INFER_PATH.match(path)
            if match is None or request.method != "POST":
                return _error(404, f"no route {request.method} {path}")
            name = match.group(1)
            if name not in self._paths:
                return _error(404, f"model {name} not found")
            try:
                document = await request.json()
                tensor = document["inputs"][0]
                if tensor["datatype"] != "FP32":
                    return _error(400, f"input {tensor['name']} must be FP32")
                features = np.asarray(tensor["data"], dtype=np.float32).reshape(tensor["shape"])
                feeds = {tensor["name"]: features}
            except (ValueError, KeyError, IndexError, TypeError) as exc:
                return _error(400, f"not a v2 inference request: {exc!r}")
            session = await self.session(name)
            try:
                # Microseconds for these models: cheaper on the loop than a thread hop.
                results = session.run(None, feeds)
            except Exception as exc:  # onnxruntime raises its own untyped errors
                return _error(400, f"model {name} failed: {exc}")
            answer: dict[str, Any] = {
                "model_name": name,
                "model_version": "1",
                "outputs": [
                    {
                        "name": meta.name,
                        "datatype": "FP32",
                        "shape": list(result.shape),
                        "data": result.ravel().tolist(),
                    }
                    for meta, result in zip(session.get_outputs(), results, strict=True)
                ],
            }
            if "id" in document:
                answer["id"] = document["id"]
            return JSONResponse(answer)

    return V2Models.bind(models)
'''

# The launcher: the Ray driver, which owns the local node and takes it down on SIGTERM.
_LAUNCHER_SOURCE = '''\
"""Start a local Ray node and Serve, deploy the v2 application, stop all on SIGTERM/SIGINT.

Usage: python corral_ray_serve_launch.py REPOSITORY PORT WORKDIR TEMP_DIR
(TEMP_DIR "-": Ray's default). Written by benchmarks/peers/ray_serve.py.
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from types import FrameType

_stop_requested = threading.Event()


def _request_stop(signum: int, frame: FrameType | None) -> None:
    _stop_requested.set()


def _catch_stop_signals() -> None:
    signal.signal(signal.SIGTERM, _request_stop)
    signal.signal(signal.SIGINT, _request_stop)


def main() -> int:
    """Serve until SIGTERM or SIGINT, then take Serve and Ray down; returns the exit code."""
    repository, port, workdir, temp_dir = sys.argv[1:5]
    # Before anything starts, so that a stop during start-up still shuts Ray down.
    _catch_stop_signals()
    import ray
    from ray import serve

    import corral_ray_serve_app

    try:
        # A SIGTERM while this runs meets Ray's own handler (sys.exit): the finally still
        # takes down whatever ray.init had started.
        ray.init(
            address="local",
            include_dashboard=False,
            num_cpus=2,
            _temp_dir=None if temp_dir == "-" else temp_dir,
        )
        # ray.init put in its own SIGTERM handler; ours lets the shutdown below run in order.
        _catch_stop_signals()
        session_dir = ray._private.worker._global_node.get_session_dir_path()
        (Path(workdir) / "ray-session-dir").write_text(session_dir)
        if not _stop_requested.is_set():
            serve.start(http_options={"host": "127.0.0.1", "port": int(port)})
            serve.run(
                corral_ray_serve_app.build_app(repository),
                name="corral",
                route_prefix="/",
            )
            print(f"serving {repository} on 127.0.0.1:{port}", flush=True)
        while not _stop_requested.wait(1.0):
            pass
        print("stopping", flush=True)
    finally:
        try:
            # Without a connected Ray, serve.shutdown would start one to look for Serve.
            if ray.is_initialized():
                serve.shutdown()
        finally:
            ray.shutdown()
    print("stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''


class RayServePeer(Peer):
    """Ray Serve: a local one-node Ray cluster, one multiplexing deployment for all models."""

    name = "ray-serve"

    def __init__(self) -> None:
        self._venv = CACHE / self.name

    @property
    def python(self) -> Path:
        """The peer's interpreter (set by :meth:`setup`; the default cache before it)."""
        return self._venv / "bin" / "python"

    def setup(self, cache: Path = CACHE) -> None:
        """Make ``cache/ray-serve``, a virtual environment with :data:`PINS` installed."""
        self._venv = cache / self.name
        stamp = self._venv / _STAMP
        wanted = {"pins": list(PINS), "python": sys.version.split()[0]}
        recorded: Any = None
        with contextlib.suppress(OSError, ValueError):
            recorded = json.loads(stamp.read_text())
        if recorded == wanted and self.python.exists():
            return
        # A venv made by another Python (or half made) is started afresh; other pins only
        # need pip.
        other_python = isinstance(recorded, dict) and recorded.get("python") != wanted["python"]
        if other_python or not self.python.exists():
            _run_or_unavailable(
                [sys.executable, "-m", "venv", "--clear", str(self._venv)],
                "creating the virtual environment",
            )
        _run_or_unavailable(
            [str(self.python), "-m", "pip", "install", "--disable-pip-version-check", *PINS],
            "pip install " + " ".join(PINS),
        )
        stamp.write_text(json.dumps(wanted) + "\n")

    def start(self, repository: Path, port: int, workdir: Path) -> Started:
        """Write the application and launcher into ``workdir`` and start the launcher.

        Stop it with SIGTERM to ``started.process.pid`` and wait for it: it takes Serve and
        Ray down before it exits (a few seconds). Its process group is its own pid.
        """
        if not self.python.exists():
            raise PeerUnavailable(f"{self._venv} has no interpreter: run setup() first")
        workdir = workdir.resolve()
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / f"{_APP_MODULE}.py").write_text(_APP_SOURCE)
        launcher = workdir / _LAUNCHER
        launcher.write_text(_LAUNCHER_SOURCE)
        temp_dir = workdir / "ray"
        temp_dir_arg = str(temp_dir) if len(str(temp_dir)) <= _MAX_RAY_TEMP_DIR else "-"
        env = dict(os.environ)
        # Ray's workers import the application by name; they inherit this environment.
        env["PYTHONPATH"] = str(workdir)
        # No usage report over a network this machine does not have.
        env["RAY_USAGE_STATS_ENABLED"] = "0"
        # Ray gives its node the address of the default route's interface, and its processes
        # talk to each other there. Its switch for single-machine platforms (read on Linux
        # too) makes that 127.0.0.1, so that all traffic stays on loopback like the others'.
        env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        log = workdir / _LOG
        with log.open("wb") as log_file:
            command = [str(self.python), str(launcher), str(repository.resolve()), str(port)]
            process = subprocess.Popen(
                [*command, str(workdir), temp_dir_arg],
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=workdir,
                env=env,
                start_new_session=True,
            )
        return Started(process, f"http://127.0.0.1:{port}", log)


def _run_or_unavailable(command: list[str], what: str) -> None:
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=_PIP_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PeerUnavailable(f"ray-serve: {what} failed: {exc}") from exc
    if done.returncode != 0:
        # The host's pip configuration names a few absent local indexes; their warnings
        # would push the actual error out of the tail.
        lines = [
            line
            for line in (done.stdout + done.stderr).splitlines()
            if not line.startswith("WARNING: Location")
        ]
        tail = "\n".join(lines[-_PIP_TAIL_LINES:])
        raise PeerUnavailable(f"ray-serve: {what} exited {done.returncode}:\n{tail}")


# -- smoke test -------------------------------------------------------------------------------

# Bounds of the smoke test: every wait ends.
_READY_TIMEOUT_S = 300.0
_STOP_TIMEOUT_S = 60.0
_REQUEST_TIMEOUT_S = 60.0
_RATE_SECONDS = 5.0
_INPUT = "X"


@dataclass
class TreeFootprint:
    """What a process and all its descendants hold at one moment."""

    processes: int
    threads: int
    #: Sum of resident memory; counts shared pages once per process.
    rss: int
    #: Sum of proportional set size: shared pages split among the processes sharing them.
    pss: int


def tree_footprint(pid: int) -> TreeFootprint:
    """Processes, threads, RSS and PSS of ``pid`` and its descendants (psutil)."""
    import psutil

    root = psutil.Process(pid)
    processes = threads = rss = pss = 0
    for process in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            memory = process.memory_full_info()
            threads += process.num_threads()
            rss += memory.rss
            pss += getattr(memory, "pss", memory.rss)
            processes += 1
    return TreeFootprint(processes, threads, rss, pss)


def v2_body(features: Any) -> bytes:
    """A v2 JSON inference request with ``features`` as input ``X``, its data flat."""
    document = {
        "inputs": [
            {
                "name": _INPUT,
                "datatype": "FP32",
                "shape": list(features.shape),
                "data": features.ravel().tolist(),
            }
        ]
    }
    return json.dumps(document).encode()


def wait_ready(started: Started, ready_path: str, timeout: float) -> float:
    """Poll ``ready_path`` until 200; returns the seconds it took. Fails if the peer exits."""
    import httpx

    begin = time.perf_counter()
    with httpx.Client(base_url=started.url, timeout=5.0) as client:
        while True:
            code = started.process.poll()
            if code is not None:
                raise RuntimeError(f"ray-serve exited {code} before ready:\n{_log_tail(started)}")
            with contextlib.suppress(httpx.TransportError):
                if client.get(ready_path).status_code == 200:
                    return time.perf_counter() - begin
            if time.perf_counter() - begin > timeout:
                raise TimeoutError(f"ray-serve not ready in {timeout:g} s:\n{_log_tail(started)}")
            time.sleep(0.25)


def stop(started: Started, timeout: float = _STOP_TIMEOUT_S) -> float:
    """SIGTERM the launcher and wait for it; returns the seconds it took.

    The launcher shuts Serve and Ray down before it exits. If it outlasts ``timeout``, its
    process group is killed and this raises.
    """
    begin = time.perf_counter()
    if started.process.poll() is None:
        started.process.send_signal(signal.SIGTERM)
    try:
        started.process.wait(timeout)
    except subprocess.TimeoutExpired as exc:
        sweep(started)
        started.process.wait(10.0)
        message = f"ray-serve ignored SIGTERM for {timeout:g} s; killed its group"
        raise RuntimeError(message) from exc
    return time.perf_counter() - begin


def sweep(started: Started) -> None:
    """SIGKILL what is left of the launcher's process group (nothing, after a clean stop).

    Needed after the launcher was killed outright: Ray's dashboard and runtime-env agents
    then outlive it. Safe after the launcher is reaped: Linux gives no new process a pid
    that still names a live process group.
    """
    with contextlib.suppress(ProcessLookupError):
        os.killpg(started.process.pid, signal.SIGKILL)


def leftovers(workdir: Path, before: Sequence[Any] = ()) -> list[str]:
    """Live processes that mention ``workdir`` or Ray's session folder, or were in ``before``.

    ``before`` holds psutil processes seen earlier (their pid and start time identify them).
    """
    import psutil

    marks = [str(workdir.resolve())]
    with contextlib.suppress(OSError):
        marks.append((workdir / SESSION_FILE).read_text().strip())
    found: dict[int, str] = {}
    for process in psutil.process_iter(["pid", "cmdline"]):
        command = " ".join(process.info["cmdline"] or ())
        if process.pid != os.getpid() and any(mark in command for mark in marks):
            found[process.pid] = command
    for process in before:
        with contextlib.suppress(psutil.NoSuchProcess):
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                found.setdefault(process.pid, " ".join(process.cmdline()))
    return [f"{pid}: {command[:200]}" for pid, command in sorted(found.items())]


def _log_tail(started: Started, lines: int = 30) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(started.log.read_text(errors="replace").splitlines()[-lines:])
    return "(no log)"


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _infer(client: Any, peer: Peer, model: str, body: bytes) -> Any:
    import numpy as np

    response = client.post(
        peer.infer_path(model), content=body, headers={"Content-Type": "application/json"}
    )
    if response.status_code != 200:
        raise RuntimeError(f"{model}: HTTP {response.status_code}: {response.text[:300]}")
    output = response.json()["outputs"][0]
    return np.asarray(output["data"], dtype=np.float32).reshape(output["shape"])


def _request_rate(client: Any, peer: Peer, models: Sequence[str], body: bytes) -> float:
    """Requests per second of one client sending ``body`` to ``models`` in turn."""
    done = 0
    begin = time.perf_counter()
    deadline = begin + _RATE_SECONDS
    while time.perf_counter() < deadline:
        _infer(client, peer, models[done % len(models)], body)
        done += 1
    return done / (time.perf_counter() - begin)


@contextlib.contextmanager
def _serving(
    peer: RayServePeer, repository: Path, workdir: Path
) -> Iterator[tuple[Started, list[Any]]]:
    """Start the peer; on exit stop it and fail if any of its processes outlive the stop.

    Yields the started peer and a list the caller fills with the process tree to check.
    """
    started = peer.start(repository, _free_port(), workdir)
    tree: list[Any] = []
    try:
        yield started, tree
    finally:
        seconds = stop(started)
        print(f"stopped in {seconds:.1f} s (launcher exit code {started.process.returncode})")
        # Ray's workers notice the raylet's end on their own; give them a moment.
        left: list[str] = []
        for _ in range(20):
            left = leftovers(workdir, tree)
            if not left:
                break
            time.sleep(0.5)
        sweep(started)
        if left:
            raise RuntimeError("processes outlived SIGTERM (now killed):\n" + "\n".join(left))
        print(f"no process left of {len(tree)} in the tree or naming {workdir}")


def smoke(count: int, cache: Path, keep: Path | None = None) -> dict[str, Any]:
    """Set up, serve ``count`` models, check two against onnxruntime, measure, stop."""
    import httpx
    import numpy as np
    import onnxruntime as ort
    import psutil

    from benchmarks.footprint import build_repository

    peer = RayServePeer()
    figures: dict[str, Any] = {"models": count}
    begin = time.perf_counter()
    peer.setup(cache)
    figures["setup_s"] = round(time.perf_counter() - begin, 1)
    print(f"setup: {figures['setup_s']} s ({peer.python})")

    with tempfile.TemporaryDirectory(prefix="rs-") as scratch:
        root = keep or Path(scratch)
        repository = root / "models"
        paths = build_repository(repository, count)
        models = [path.parent.parent.name for path in paths]
        features = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
        body = v2_body(features)

        with _serving(peer, repository, root / "work") as (started, tree):
            figures["ready_s"] = round(wait_ready(started, peer.ready_path(), _READY_TIMEOUT_S), 1)
            print(f"ready: {figures['ready_s']} s; log {started.log}")
            figures["idle"] = tree_footprint(started.process.pid).__dict__

            with httpx.Client(base_url=started.url, timeout=_REQUEST_TIMEOUT_S) as client:
                for index in (0, len(models) - 1):
                    options = ort.SessionOptions()
                    options.intra_op_num_threads = 1
                    session = ort.InferenceSession(str(paths[index]), sess_options=options)
                    (expected,) = session.run(None, {_INPUT: features})
                    got = _infer(client, peer, models[index], body)
                    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
                    print(f"{models[index]}: matches onnxruntime {got.ravel().tolist()}")

                first = time.perf_counter()
                for model in models:
                    _infer(client, peer, model, body)
                figures["all_answer_s"] = round(time.perf_counter() - first, 2)
                seconds = figures["all_answer_s"]
                print(f"all {count} models answered (loading on demand): {seconds} s")

                tree.extend(psutil.Process(started.process.pid).children(recursive=True))
                tree.append(psutil.Process(started.process.pid))
                loaded = tree_footprint(started.process.pid)
                figures["loaded"] = loaded.__dict__
                print(
                    f"tree: {loaded.processes} processes, {loaded.threads} threads, "
                    f"RSS {loaded.rss / 2**20:.0f} MiB, PSS {loaded.pss / 2**20:.0f} MiB"
                )
                figures["rate_one_model"] = round(_request_rate(client, peer, models[:1], body))
                figures["rate_all_models"] = round(_request_rate(client, peer, models, body))
                print(
                    f"one client: {figures['rate_one_model']} req/s on one model, "
                    f"{figures['rate_all_models']} req/s across all {count}"
                )
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    """The smoke test's command line; returns the exit code."""
    parser = argparse.ArgumentParser(
        prog="benchmarks/peers/ray_serve.py",
        description="Set Ray Serve up, serve tiny models over v2 JSON, check, measure, stop.",
    )
    parser.add_argument("--models", type=int, default=10, help="models to serve (default 10)")
    parser.add_argument("--cache", type=Path, default=CACHE, help=f"venv cache (default {CACHE})")
    parser.add_argument("--keep", type=Path, help="build and work here instead of a temp folder")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the figures here")
    args = parser.parse_args(argv)
    try:
        figures = smoke(args.models, args.cache, args.keep)
    except PeerUnavailable as exc:
        print(f"unavailable: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(figures))
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
