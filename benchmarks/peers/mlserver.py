"""Seldon MLServer as a peer: ONNX models on onnxruntime behind MLServer's v2 endpoints.

MLServer has no ONNX runtime of its own, so :meth:`MLServerPeer.start` writes a custom
``MLModel`` (:data:`RUNTIME_SOURCE`, one onnxruntime ``InferenceSession`` per model) into
the work folder beside MLServer's configuration: one ``settings.json`` for the server and one
``model-settings.json`` per model of the repository. MLServer loads every model it finds
there at startup, before ``/v2/health/ready`` answers 200.

MLServer runs in its own virtual environment (``<cache>/mlserver``, see :data:`PINS`); this
module only needs the standard library, so it imports without MLServer. Its smoke mode
builds a repository, serves it, checks two answers against onnxruntime and measures the
server (it needs the project's venv: numpy, onnxruntime, httpx, psutil)::

    .venv/bin/python benchmarks/peers/mlserver.py --models 10
"""

from __future__ import annotations

import argparse
import datetime
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
from typing import TYPE_CHECKING, Any

from benchmarks.peers import CACHE, Peer, PeerUnavailable, Started, free_port_pair
from benchmarks.server_processes import stop_process

if TYPE_CHECKING:
    import httpx
    import numpy as np

__all__ = ["PINS", "RUNTIME_SOURCE", "MLServerPeer", "main"]

#: What ``setup`` installs. uvloop is held at 0.21.0 because with 0.23 MLServer's parallel
#: inference workers (``parallel_workers`` of 1 or more) die at start ("There is no current
#: event loop") and their models never become ready; onnxruntime and numpy are the versions
#: of the project's venv, so both servers run the same kernels.
PINS: tuple[str, ...] = (
    "mlserver==1.7.1",
    "uvloop==0.21.0",
    "onnxruntime==1.32.0",
    "numpy==2.4.6",
)

#: The runtime module MLServer imports (``corral_onnx.OnnxModel``), written into the work
#: folder. ``{intra_op_num_threads}`` is filled in by :meth:`MLServerPeer.start`.
RUNTIME_SOURCE = '''\
"""ONNX on onnxruntime as an MLServer runtime (written by corral's benchmarks)."""

import onnxruntime
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse
from mlserver.utils import get_model_uri

# One intra-op thread per session is the setting a careful user serving many models
# would choose. With default options every session starts its own intra-op pool (one
# thread per core): measured with 1,000 models on 2 cores, 1,015 OS threads instead of
# 15, and an idle server burning a whole core with all 1,000 pool threads runnable.
# None keeps the default.
INTRA_OP_NUM_THREADS = {intra_op_num_threads}


class OnnxModel(MLModel):
    async def load(self) -> bool:
        options = onnxruntime.SessionOptions()
        if INTRA_OP_NUM_THREADS is not None:
            options.intra_op_num_threads = INTRA_OP_NUM_THREADS
        self._session = onnxruntime.InferenceSession(
            await get_model_uri(self.settings), options, providers=["CPUExecutionProvider"]
        )
        self._output_names = [output.name for output in self._session.get_outputs()]
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        feeds = {{tensor.name: NumpyCodec.decode_input(tensor) for tensor in payload.inputs}}
        results = self._session.run(self._output_names, feeds)
        return InferenceResponse(
            model_name=self.name,
            model_version=self.version,
            outputs=[
                NumpyCodec.encode_output(name, result)
                for name, result in zip(self._output_names, results)
            ],
        )
'''

_RUNTIME_MODULE = "corral_onnx"
_RUNTIME_CLASS = f"{_RUNTIME_MODULE}.OnnxModel"
_STAMP = "corral-pins.txt"
_MODEL_FILE = "model.onnx"
# pip on a slow mirror takes a minute or two; past this something hangs.
_PIP_TIMEOUT_S = 1800.0
_PIP_ERROR_LINES = 15


class MLServerPeer(Peer):
    """Seldon MLServer 1.7.1 serving every model of a repository with an onnxruntime runtime.

    ``parallel_workers`` is MLServer's own setting. 0, chosen here, runs inference in the
    HTTP front end's event loop; MLServer's default, 1, runs it in one worker process behind
    a queue, which on these tiny models measured worse on every count (1,000 models on 2
    cores: about half the requests/s, 180 MiB more RSS, 2.5x the startup) and, after load
    from several connections, hangs on SIGTERM until killed. ``intra_op_num_threads`` goes
    to every ``InferenceSession``; ``None`` keeps onnxruntime's default (a pool of one
    thread per core for every session). ``max_batch_size`` above 1 turns on MLServer's
    adaptive batching (``max_batch_size`` and ``max_batch_time`` in every
    model-settings.json, the latter ``max_batch_time_s`` seconds); 0 leaves it off.

    Example::

        peer = MLServerPeer()
        peer.setup()
        started = peer.start(Path("models"), 9000, Path("work"))
    """

    name = "mlserver"

    def __init__(
        self,
        *,
        parallel_workers: int = 0,
        intra_op_num_threads: int | None = 1,
        max_batch_size: int = 0,
        max_batch_time_s: float = 0.0,
    ) -> None:
        if parallel_workers < 0:
            raise ValueError(f"parallel_workers must be at least 0, got {parallel_workers}")
        if intra_op_num_threads is not None and intra_op_num_threads < 1:
            raise ValueError(
                f"intra_op_num_threads must be at least 1 or None, got {intra_op_num_threads}"
            )
        if max_batch_size < 0 or max_batch_time_s < 0:
            raise ValueError(
                f"max_batch_size and max_batch_time_s must be at least 0, got "
                f"{max_batch_size} and {max_batch_time_s}"
            )
        self.parallel_workers = parallel_workers
        self.intra_op_num_threads = intra_op_num_threads
        # MLServer's adaptive batching (model-settings.json), on when max_batch_size > 1;
        # written only when asked for, so that the defaults stay MLServer's own.
        self.max_batch_size = max_batch_size
        self.max_batch_time_s = max_batch_time_s
        self._venv = CACHE / self.name

    def setup(self, cache: Path = CACHE) -> None:
        """Create ``cache/mlserver`` and install :data:`PINS`; quick once its stamp matches."""
        venv = cache / self.name
        self._venv = venv
        stamp = venv / _STAMP
        wanted = _stamp_text()
        if stamp.is_file() and stamp.read_text() == wanted and _mlserver(venv).is_file():
            return
        stamp.unlink(missing_ok=True)
        _run_or_unavailable(
            [sys.executable, "-m", "venv", "--clear", str(venv)], "creating the venv failed"
        )
        _run_or_unavailable(
            [
                str(venv / "bin" / "python"),
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "--no-input",
                *PINS,
            ],
            "pip install failed",
        )
        stamp.write_text(wanted)

    def start(self, repository: Path, port: int, workdir: Path) -> Started:
        """Write MLServer's configuration for every model into ``workdir`` and start it.

        Raises :class:`PeerUnavailable` if :meth:`setup` has not installed MLServer.
        """
        mlserver = _mlserver(self._venv)
        if not mlserver.is_file():
            raise PeerUnavailable(f"MLServer is not installed in {self._venv}: run setup() first")
        models = _triton_models(repository)
        if not models:
            raise ValueError(f"no <name>/<version>/{_MODEL_FILE} in {repository}")
        workdir.mkdir(parents=True, exist_ok=True)
        # MLServer serves every model-settings.json under workdir: none from an earlier run.
        shutil.rmtree(workdir / "models", ignore_errors=True)
        _write_json(
            workdir / "settings.json",
            {
                "host": "127.0.0.1",
                "http_port": port,
                # gRPC cannot be turned off in MLServer 1.7.1: it takes the next port.
                "grpc_port": port + 1,
                # No metrics server (it would need a third port) and no Prometheus middleware.
                "metrics_endpoint": None,
                # debug (MLServer's default) logs every request: a production setting is off.
                "debug": False,
                "parallel_workers": self.parallel_workers,
                "load_models_at_startup": True,
            },
        )
        (workdir / f"{_RUNTIME_MODULE}.py").write_text(
            RUNTIME_SOURCE.format(intra_op_num_threads=self.intra_op_num_threads)
        )
        for name, model in models.items():
            _write_json(
                workdir / "models" / name / "model-settings.json",
                {
                    "name": name,
                    "implementation": _RUNTIME_CLASS,
                    "parameters": {"uri": str(model.resolve())},
                    **(
                        {
                            "max_batch_size": self.max_batch_size,
                            "max_batch_time": self.max_batch_time_s,
                        }
                        if self.max_batch_size
                        else {}
                    ),
                },
            )
        log = workdir / "mlserver.log"
        # pydantic-settings would read MLSERVER_* variables over settings.json.
        env = {key: value for key, value in os.environ.items() if not key.startswith("MLSERVER")}
        with log.open("wb") as out:
            process = subprocess.Popen(
                [str(mlserver), "start", str(workdir)],
                cwd=workdir,  # where MLServer puts its .envs and .metrics folders
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                # A terminal's Ctrl-C reaches the caller only; the caller stops the server.
                start_new_session=True,
            )
        return Started(process, f"http://127.0.0.1:{port}", log)


def _stamp_text() -> str:
    # The venv is bound to the base interpreter, not to whichever venv ran setup.
    return "\n".join([f"python {sys.version.split()[0]} {sys.base_prefix}", *PINS]) + "\n"


def _mlserver(venv: Path) -> Path:
    return venv / "bin" / "mlserver"


def _run_or_unavailable(argv: Sequence[str], failure: str) -> None:
    try:
        subprocess.run(
            argv,
            check=True,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=_PIP_TIMEOUT_S,
        )
    except subprocess.CalledProcessError as exc:
        tail = (exc.stdout + exc.stderr).strip().splitlines()[-_PIP_ERROR_LINES:]
        raise PeerUnavailable(f"{failure} (exit {exc.returncode}):\n" + "\n".join(tail)) from exc
    except subprocess.TimeoutExpired as exc:
        raise PeerUnavailable(f"{failure}: no end after {_PIP_TIMEOUT_S:.0f} s") from exc
    except OSError as exc:
        raise PeerUnavailable(f"{failure}: {exc}") from exc


def _triton_models(repository: Path) -> dict[str, Path]:
    """``{name: model file}`` of a Triton-layout repository, each at its highest version."""
    models = {}
    for folder in sorted(path for path in repository.iterdir() if path.is_dir()):
        versions = [
            version
            for version in folder.iterdir()
            if version.name.isdigit() and (version / _MODEL_FILE).is_file()
        ]
        if versions:
            models[folder.name] = max(versions, key=lambda version: int(version.name)) / _MODEL_FILE
    return models


def _write_json(path: Path, document: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n")


# The smoke mode below runs in the project's venv; it imports numpy, onnxruntime, httpx and
# psutil lazily so that the peer itself needs none of them.

_STOP_TIMEOUT_S = 10.0


def _log_tail(log: Path, lines: int = 20) -> str:
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.strip().splitlines()[-lines:]) or "(empty log)"


def _payload(features: np.ndarray[Any, Any]) -> dict[str, Any]:
    return {
        "inputs": [
            {
                "name": "X",
                "datatype": "FP32",
                "shape": list(features.shape),
                "data": features.ravel().tolist(),
            }
        ]
    }


def _wait_ready(client: httpx.Client, peer: Peer, started: Started, deadline: float) -> None:
    import httpx

    while True:
        if started.process.poll() is not None:
            raise RuntimeError(
                f"mlserver exited with code {started.process.returncode} during startup; "
                f"its log:\n{_log_tail(started.log)}"
            )
        try:
            if client.get(peer.ready_path()).status_code == 200:
                return
        except httpx.TransportError:
            pass  # not listening yet
        if time.monotonic() > deadline:
            raise TimeoutError(f"mlserver not ready in time; its log:\n{_log_tail(started.log)}")
        time.sleep(0.1)


def _infer_until_answered(
    client: httpx.Client, path: str, payload: dict[str, Any], deadline: float
) -> dict[str, Any]:
    """Post ``payload`` until a 200 (a model may still be loading); return its JSON."""
    import httpx

    while True:
        try:
            response = client.post(path, json=payload)
            if response.status_code == 200:
                answer: dict[str, Any] = response.json()
                return answer
            problem = f"{response.status_code} {response.text[:200]}"
        except httpx.TransportError as exc:
            problem = repr(exc)
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not answer in time: {problem}")
        time.sleep(0.05)


def _process_tree(pid: int) -> dict[str, Any]:
    """OS threads and resident memory (MiB) of ``pid`` and its descendants, each and in all."""
    import psutil

    root = psutil.Process(pid)
    each = [
        {
            "pid": process.pid,
            "command": " ".join(process.cmdline()[-2:])[-60:],
            "threads": process.num_threads(),
            "rss_mib": round(process.memory_info().rss / 2**20, 1),
        }
        for process in [root, *root.children(recursive=True)]
    ]
    return {
        "processes": each,
        "threads": sum(process["threads"] for process in each),
        "rss_mib": round(sum(process["rss_mib"] for process in each), 1),
    }


def _request_rate(
    client: httpx.Client, path: str, payload: dict[str, Any], seconds: float
) -> float:
    """Requests/s of one client posting ``payload`` back to back for ``seconds``."""
    body = json.dumps(payload).encode()
    headers = {"content-type": "application/json"}
    count = 0
    start = time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        response = client.post(path, content=body, headers=headers)
        if response.status_code != 200:
            raise RuntimeError(f"{path}: {response.status_code} {response.text[:200]}")
        count += 1
    return count / elapsed


def _loading_span(log: Path) -> dict[str, float]:
    """From the log's timestamps: seconds from its first line to the first and last model loaded."""

    def stamp(line: str) -> float:
        return datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()

    lines = [line for line in log.read_text(errors="replace").splitlines() if line[:2] == "20"]
    loaded = [stamp(line) for line in lines if "Loaded model" in line]
    if not lines or not loaded:
        return {}
    first = stamp(lines[0])
    return {
        "log_first_model_loaded_s": round(loaded[0] - first, 2),
        "log_last_model_loaded_s": round(loaded[-1] - first, 2),
    }


def _stop(process: subprocess.Popen[bytes]) -> int:
    """SIGTERM ``process`` by its pid, SIGKILL it after 10 s, then any child it left behind."""
    import psutil

    try:
        children = psutil.Process(process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    stop_process(process, _STOP_TIMEOUT_S)
    # After a clean exit MLServer has stopped its workers already; after SIGKILL they are
    # orphans that no longer exit on their own.
    _, alive = psutil.wait_procs(children, timeout=2.0)
    for child in alive:
        print(f"mlserver left pid {child.pid} running: SIGKILL", file=sys.stderr)
        child.kill()
    return process.returncode


def smoke(
    count: int,
    *,
    cache: Path = CACHE,
    parallel_workers: int = 0,
    intra_op_num_threads: int | None = 1,
    timeout_s: float = 120.0,
    rate_seconds: float = 5.0,
) -> dict[str, Any]:
    """Serve ``count`` tiny models with MLServer, check two answers, measure; return figures."""
    import httpx
    import numpy as np
    import onnxruntime

    from benchmarks.footprint import build_repository

    peer = MLServerPeer(
        parallel_workers=parallel_workers, intra_op_num_threads=intra_op_num_threads
    )
    results: dict[str, Any] = {
        "models": count,
        "parallel_workers": parallel_workers,
        "intra_op_num_threads": intra_op_num_threads,
    }
    begin = time.monotonic()
    peer.setup(cache)
    results["setup_s"] = round(time.monotonic() - begin, 2)

    with tempfile.TemporaryDirectory(prefix="corral-mlserver-") as scratch:
        repository = Path(scratch) / "repository"
        model_files = build_repository(repository, count)
        names = [path.parent.parent.name for path in model_files]
        features = np.random.default_rng(0).random((3, 4), dtype=np.float32)
        payload = _payload(features)
        port = free_port_pair()

        begin = time.monotonic()
        started = peer.start(repository, port, Path(scratch) / "work")
        try:
            deadline = begin + timeout_s
            with httpx.Client(base_url=started.url, timeout=30.0) as client:
                _wait_ready(client, peer, started, deadline)
                results["ready_s"] = round(time.monotonic() - begin, 2)
                for name in names:
                    _infer_until_answered(client, peer.infer_path(name), payload, deadline)
                results["all_answer_s"] = round(time.monotonic() - begin, 2)

                checked = {}
                for path, name in [(model_files[0], names[0]), (model_files[-1], names[-1])]:
                    answer = _infer_until_answered(client, peer.infer_path(name), payload, deadline)
                    (output,) = answer["outputs"]
                    got = np.asarray(output["data"], dtype=np.float32).reshape(output["shape"])
                    session = onnxruntime.InferenceSession(
                        str(path), providers=["CPUExecutionProvider"]
                    )
                    (expected,) = session.run(["Y"], {"X": features})
                    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
                    checked[name] = float(np.max(np.abs(got - expected)))
                results["checked_max_abs_diff"] = checked

                results.update(_loading_span(started.log))
                results.update(_process_tree(started.process.pid))
                results["single_client_req_per_s"] = round(
                    _request_rate(
                        client, peer.infer_path(names[0]), _payload(features[:1]), rate_seconds
                    )
                )
        finally:
            results["exit_code"] = _stop(started.process)
            results["log_tail"] = _log_tail(started.log, 5)
    return results


def _raise_system_exit(signum: int, frame: object) -> None:
    # SIGTERM ends the smoke run through its finally block, which stops the server.
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    """The smoke mode: ``python benchmarks/peers/mlserver.py --models 10``."""
    parser = argparse.ArgumentParser(
        prog="benchmarks/peers/mlserver.py",
        description="Serve N tiny ONNX models with MLServer, check two answers, measure it.",
    )
    add = parser.add_argument
    add("--models", type=int, default=10, help="models in the repository (10)")
    add("--cache", type=Path, default=CACHE, help=f"where the peer venv lives ({CACHE})")
    add("--parallel-workers", type=int, default=0, help="MLServer's parallel_workers (0)")
    add(
        "--default-threads",
        action="store_true",
        help="onnxruntime's default session options (no intra_op_num_threads=1)",
    )
    add("--timeout", type=float, default=120.0, help="seconds until all answer (120)")
    add("--rate-seconds", type=float, default=5.0, help="single-client load seconds (5)")
    args = parser.parse_args(argv)
    previous = signal.signal(signal.SIGTERM, _raise_system_exit)
    try:
        results = smoke(
            args.models,
            cache=args.cache,
            parallel_workers=args.parallel_workers,
            intra_op_num_threads=None if args.default_threads else 1,
            timeout_s=args.timeout,
            rate_seconds=args.rate_seconds,
        )
    except PeerUnavailable as exc:
        print(f"mlserver unavailable: {exc}", file=sys.stderr)
        return 2
    finally:
        signal.signal(signal.SIGTERM, previous)
    for key, value in results.items():
        print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
