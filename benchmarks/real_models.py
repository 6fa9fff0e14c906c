"""corral on real models from published wheels, against FastAPI, MLServer and the ceiling.

``make bench-real`` runs this. The ONNX files come from four wheels on PyPI, fetched by name
and pinned version with ``pip download --no-deps`` into the bench cache
(``$CORRAL_BENCH_CACHE/real-models``, default ``~/.cache/corral-bench``) and unzipped there:
nothing else is downloaded, and nothing at all once the cache holds them.

For each model, side by side in one run, round by round with the targets in turn (so that
other work on this shared machine falls on all of them alike), at each connection count:

- ``corral``: ``corral serve`` with its defaults, JSON bodies; ``corral-binary``: the same
  process, the binary tensor extension; ``corral-tuned``: a second ``corral serve`` whose
  model.toml holds the model's :attr:`RealModel.tuned` settings;
- ``fastapi``: ``reference/fastapi_real.py``, a FastAPI + onnxruntime service as users write
  it, in its own venv (the one ``bench_peers.py``'s FastAPI peer uses);
- ``mlserver`` / ``mlserver-batch``: MLServer 1.7.1 with adaptive batching off and on
  (``benchmarks/peers/mlserver.py``), with ``--mlserver``;
- ``triton`` / ``triton-binary``: NVIDIA Triton with its C++ onnxruntime backend
  (``benchmarks/peers/triton_ort.py``), JSON and binary bodies, when ``make triton-peer`` has
  built it (a line says so when it has not), on a copy of the model with a complete
  ``config.pbtxt`` written from its signature (``max_batch_size: 0``; ``--instance-count N``
  adds ``instance_group { count: N }``); ``corral-pbtxt``: ``corral serve`` of that same
  folder, config.pbtxt and all (``corral`` keeps its defaults: it may batch, Triton then not);
- ``corral-2p`` / ``corral-2p-binary``: ``corral serve --processes 2`` on ``corral``'s
  repository, JSON and binary bodies (two processes behind the port, the cores split);
- ``ceiling``: onnxruntime called in this process, no HTTP: the best of one session with
  intra-op threads = cores at batch 1, 8 and 32, and one single-threaded session per core,
  each run from its own thread at batch 1 (onnxruntime releases the GIL).

The servers are driven by wrk (``infer.lua``, closed loop, one fixed body); every answer is
first checked against onnxruntime's own. CPU seconds per request, for every server, are its
process tree's user + system time over the run divided by its requests. The ceiling also gives
each model's per-row cost at batch 1, 8 and 32 on one thread: whether batching pays here.

``--mixed`` adds the mixed load: one corral serving 1,000 tiny models and one real model;
an open-loop client sends the tiny models a steady rate (latency measured from each
request's scheduled time, so a stall is not hidden) alone, then while wrk drives the real
model to saturation; the tiny models' p99 with and without.

``--quick``: magika only, one round of 1 s at 8 connections, corral and the ceiling only
(the test in tests/ runs it). Exit code 3: the wheels could not be fetched.

Example::

    python benchmarks/real_models.py --models magika,silero-vad --rounds 2 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import http.client
import importlib.metadata
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import psutil

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

from benchmarks import http_bench, server_processes  # noqa: E402
from benchmarks.http_bench import BenchmarkError, Payload  # noqa: E402
from benchmarks.peers import CACHE, PeerUnavailable, install_venv, triton_ort  # noqa: E402
from benchmarks.peers.local import FASTAPI_PINS  # noqa: E402

RESULTS = HERE / "results"
CORES = os.cpu_count() or 1
#: Exit code when the wheels cannot be fetched (the test skips on it).
EXIT_UNAVAILABLE = 3
_WRK_TIMEOUT = "30s"  # nudenet at 64 connections waits seconds: not an error
_READY_TIMEOUT_S = 120.0
_DRAIN_LIMIT_S = 300.0

Feeds = dict[str, np.ndarray[Any, Any]]


class ModelsUnavailable(Exception):
    """The wheels could not be fetched or unpacked; the message says why."""


@dataclass(frozen=True)
class Wheel:
    """A published wheel pinned by version, and the ONNX files taken from it."""

    package: str
    version: str

    @property
    def pin(self) -> str:
        """``package==version``."""
        return f"{self.package}=={self.version}"


MAGIKA = Wheel("magika", "1.0.3")
RAPIDOCR = Wheel("rapidocr-onnxruntime", "1.4.4")
SILERO = Wheel("silero-vad", "6.2.3")
NUDENET = Wheel("nudenet", "3.4.2")


@dataclass(frozen=True)
class RealModel:
    """One model: where it is in its wheel, how a realistic request looks, how to tune it."""

    name: str
    wheel: Wheel
    member: str
    #: The inputs of a request of ``rows`` rows (the ceiling's batches use the same builder).
    feeds: Callable[[int, dict[str, bytes]], Feeds]
    #: Why these inputs: shown in docs/benchmarks.md.
    note: str
    #: model.toml of ``corral-tuned``.
    tuned: str
    #: Whether the first dimension is the rows (MLServer's adaptive batching needs it).
    batchable: bool = True


def _magika(rows: int, files: dict[str, bytes]) -> Feeds:
    # Magika's features: the first and last 1,024 bytes of the stripped file, padded with
    # token 256 (its config: beg_size = end_size = 1024, padding_token 256). The file is the
    # model's own config.min.json, a real 2 KiB JSON file, the same on every run.
    content = files["magika/models/standard_v3_3/config.min.json"].strip()
    beg = list(content[:1024]) + [256] * (1024 - len(content[:1024]))
    end = [256] * (1024 - len(content[-1024:])) + list(content[-1024:])
    row = np.asarray(beg + end, dtype=np.int32)
    return {"bytes": np.tile(row, (rows, 1))}


def _text_line(rows: int, height: int, width: int) -> np.ndarray[Any, Any]:
    # A dark-on-white text line: glyph-like bars on white, normalized as PP-OCR does,
    # (pixel / 255 - 0.5) / 0.5.
    rng = np.random.default_rng(0)
    image = np.full((height, width), 255.0, dtype=np.float32)
    for left in range(8, width - 16, 14):
        top = int(rng.integers(8, 14))
        image[top : height - 8, left : left + int(rng.integers(3, 9))] = 20.0
    normal = (image / 255.0 - 0.5) / 0.5
    return np.ascontiguousarray(np.broadcast_to(normal, (rows, 3, height, width)))


def _photo(rows: int, size: int) -> np.ndarray[Any, Any]:
    # A smooth synthetic photo scaled to [0, 1] (CNN cost does not depend on the values).
    y, x = np.mgrid[0:size, 0:size].astype(np.float32) / size
    channels = np.stack([x, y, (x + y) / 2]) * 0.8 + 0.1
    return np.ascontiguousarray(np.broadcast_to(channels, (rows, 3, size, size)), np.float32)


def _silero(rows: int, files: dict[str, bytes]) -> Feeds:
    # One 32 ms chunk at 16 kHz as silero-vad 5+ runs it: 64 samples of context + 512 new
    # ones (576), the recurrent state [2, rows, 128] (zeros: a stream's first chunk) and the
    # sample rate as an INT64 scalar. The audio: a 440 Hz tone with a little noise.
    t = np.arange(576, dtype=np.float32) / 16000
    rng = np.random.default_rng(0)
    chunk = 0.3 * np.sin(2 * np.pi * 440 * t) + 0.01 * rng.standard_normal(576)
    return {
        "input": np.tile(chunk.astype(np.float32), (rows, 1)),
        "state": np.zeros((2, rows, 128), dtype=np.float32),
        "sr": np.array(16000, dtype=np.int64),
    }


_NOT_BATCHED = "max_batch_size = 0\n"
_SMALL_BATCHES = "max_batch_size = 8\nbatch_window_us = 1000\n"

MODELS: dict[str, RealModel] = {
    model.name: model
    for model in (
        RealModel(
            "magika",
            MAGIKA,
            "magika/models/standard_v3_3/model.onnx",
            _magika,
            "`bytes` INT32 [1, 2048]: the first and last 1,024 bytes of a 2 KiB JSON file",
            _NOT_BATCHED,
        ),
        RealModel(
            "silero-vad",
            SILERO,
            "silero_vad/data/silero_vad.onnx",
            _silero,
            "`input` FP32 [1, 576] (a 32 ms chunk at 16 kHz plus 64 samples of context), "
            "`state` FP32 [2, 1, 128] zeros, `sr` INT64 scalar 16000",
            # Its state's rows are on axis 1 and sr is a scalar: corral cannot batch it.
            _NOT_BATCHED,
            batchable=False,
        ),
        RealModel(
            "ocr-cls",
            RAPIDOCR,
            "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
            lambda rows, files: {"x": _text_line(rows, 48, 192)},
            "`x` FP32 [1, 3, 48, 192]: one text-line crop at rapidocr's cls_image_shape",
            _SMALL_BATCHES,
        ),
        RealModel(
            "ocr-rec",
            RAPIDOCR,
            "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
            lambda rows, files: {"x": _text_line(rows, 48, 320)},
            "`x` FP32 [1, 3, 48, 320]: one text-line crop at rapidocr's rec_img_shape",
            _SMALL_BATCHES,
        ),
        RealModel(
            "ocr-det",
            RAPIDOCR,
            "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
            lambda rows, files: {"x": _photo(rows, 736)},
            "`x` FP32 [1, 3, 736, 736]: rapidocr's limit_side_len (736, a multiple of 32)",
            _NOT_BATCHED,
        ),
        RealModel(
            "nudenet",
            NUDENET,
            "nudenet/320n.onnx",
            lambda rows, files: {"images": _photo(rows, 320)},
            "`images` FP32 [1, 3, 320, 320]: NudeDetector's 320 x 320 letterboxed input",
            _NOT_BATCHED,
        ),
    )
}
DEFAULT_MODELS = ("magika", "silero-vad", "ocr-cls", "ocr-rec", "nudenet")


# -- the wheels -------------------------------------------------------------------------------


def fetch_models(names: Sequence[str], cache: Path = CACHE) -> tuple[dict[str, Path], Path]:
    """Each model's ONNX file under ``cache/real-models``; downloads a missing wheel by name.

    Returns ``{model name: file}`` and the folder of the unpacked files (the feeds' extra
    files, such as magika's config, live there too). Raises :class:`ModelsUnavailable`.
    """
    root = cache / "real-models"
    wheels_dir, unpacked = root / "wheels", root / "unpacked"
    files: dict[str, Path] = {}
    for name in names:
        model = MODELS[name]
        target = unpacked / model.wheel.pin / model.member
        if not target.is_file():
            wheel = _download(model.wheel, wheels_dir)
            with zipfile.ZipFile(wheel) as archive:
                members = [
                    member for member in archive.namelist() if member.endswith((".onnx", ".json"))
                ]
                archive.extractall(unpacked / model.wheel.pin, members)
            if not target.is_file():
                raise ModelsUnavailable(f"{wheel.name} holds no {model.member}")
        files[name] = target
    return files, unpacked


def _download(wheel: Wheel, folder: Path) -> Path:
    prefix = wheel.package.replace("-", "_") + "-" + wheel.version + "-"
    found = [path for path in folder.glob("*.whl") if path.name.startswith(prefix)]
    if found:
        return found[0]
    folder.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "-q",
        "-d",
        str(folder),
        wheel.pin,
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    except subprocess.TimeoutExpired as exc:
        raise ModelsUnavailable(f"pip download {wheel.pin}: no end after 600 s") from exc
    found = [path for path in folder.glob("*.whl") if path.name.startswith(prefix)]
    if done.returncode != 0 or not found:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-5:])
        raise ModelsUnavailable(f"pip download {wheel.pin} failed:\n{tail}")
    return found[0]


def extra_files(unpacked: Path, model: RealModel) -> dict[str, bytes]:
    """The JSON files unpacked from ``model``'s wheel, by their path in it."""
    base = unpacked / model.wheel.pin
    return {str(path.relative_to(base)): path.read_bytes() for path in base.rglob("*.json")}


# -- payloads ---------------------------------------------------------------------------------

_DATATYPES = {
    np.dtype(np.float32): "FP32",
    np.dtype(np.int32): "INT32",
    np.dtype(np.int64): "INT64",
}


def json_payload(feeds: Feeds) -> Payload:
    """A v2 JSON body with every input, data flat."""
    document = {
        "inputs": [
            {
                "name": name,
                "datatype": _DATATYPES[array.dtype],
                "shape": list(array.shape),
                "data": np.ascontiguousarray(array).ravel(),
            }
            for name, array in feeds.items()
        ]
    }
    return Payload(orjson.dumps(document, option=orjson.OPT_SERIALIZE_NUMPY), "application/json")


def binary_payload(feeds: Feeds) -> Payload:
    """The same inputs with the binary tensor extension; outputs asked for as binary."""
    raws = [
        np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<")).tobytes()
        for array in feeds.values()
    ]
    document = {
        "inputs": [
            {
                "name": name,
                "datatype": _DATATYPES[array.dtype],
                "shape": list(array.shape),
                "parameters": {"binary_data_size": len(raw)},
            }
            for (name, array), raw in zip(feeds.items(), raws, strict=True)
        ],
        "parameters": {"binary_data_output": True},
    }
    header = orjson.dumps(document)
    return Payload(header + b"".join(raws), "application/octet-stream", len(header))


# -- the ceiling: onnxruntime in this process -------------------------------------------------


def _session(path: Path, threads: int) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _loop(session: Any, feeds: Feeds, seconds: float, latencies: list[float]) -> int:
    runs = 0
    end = time.perf_counter() + seconds
    while (now := time.perf_counter()) < end:
        session.run(None, feeds)
        latencies.append(time.perf_counter() - now)
        runs += 1
    return runs


def _per_core(
    sessions: Sequence[Any], feeds: Feeds, seconds: float
) -> tuple[int, float, float, list[float]]:
    """Each session run from a thread of its own at once: rows, seconds, CPU s, latencies."""
    for session in sessions:
        session.run(None, feeds)
    counts = [0] * len(sessions)
    per_thread: list[list[float]] = [[] for _ in sessions]

    def worker(index: int) -> None:
        counts[index] = _loop(sessions[index], feeds, seconds, per_thread[index])

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(sessions))]
    cpu, began = time.process_time(), time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return (
        sum(counts),
        time.perf_counter() - began,
        time.process_time() - cpu,
        [x for part in per_thread for x in part],
    )


def ceiling_cell(path: Path, make: Callable[[int], Feeds], seconds: float) -> float:
    """Rows/s of one single-threaded session per core, the way that won on every model here.

    Measured in every cell, so that each server run has a ceiling measured beside it,
    under the same background load.
    """
    rows, elapsed, _, _ = _per_core([_session(path, 1) for _ in range(CORES)], make(1), seconds)
    return rows / elapsed


def ceiling_once(
    path: Path, make: Callable[[int], Feeds], seconds: float, batchable: bool
) -> dict[str, Any]:
    """One round of the ceiling: each way of running, and the per-row cost on one thread."""
    ways: dict[str, dict[str, float]] = {}

    def record(way: str, rows: int, elapsed: float, cpu: float, latencies: list[float]) -> None:
        ways[way] = {
            "rows_per_s": rows / elapsed,
            "cpu_s_per_row": cpu / rows,
            "p50_ms": float(np.percentile(latencies, 50)) * 1000,
            "p99_ms": float(np.percentile(latencies, 99)) * 1000,
        }

    shared = _session(path, CORES)
    for batch in (1, 8, 32) if batchable else (1,):
        feeds = make(batch)
        shared.run(None, feeds)
        latencies: list[float] = []
        cpu, began = time.process_time(), time.perf_counter()
        runs = _loop(shared, feeds, seconds, latencies)
        record(
            f"{CORES} threads, batch {batch}",
            runs * batch,
            time.perf_counter() - began,
            time.process_time() - cpu,
            latencies,
        )
    del shared
    sessions = [_session(path, 1) for _ in range(CORES)]
    record(f"{CORES} x 1 thread, batch 1", *_per_core(sessions, make(1), seconds))
    # Does batching pay on this CPU: one thread, batch 1, 8, 32, CPU time per row.
    per_row: dict[str, float] = {}
    for batch in (1, 8, 32) if batchable else (1,):
        batch_feeds = make(batch)
        sessions[0].run(None, batch_feeds)
        cpu = time.process_time()
        runs = _loop(sessions[0], batch_feeds, max(seconds / 3, 0.3), [])
        per_row[str(batch)] = (time.process_time() - cpu) / (runs * batch) * 1000
    best = max(ways, key=lambda way: ways[way]["rows_per_s"])
    return {"ways": ways, "best": best, **ways[best], "ms_per_row_one_thread": per_row}


# -- servers ----------------------------------------------------------------------------------


@dataclass
class Server:
    """A started server process and how to reach its model."""

    name: str
    process: subprocess.Popen[bytes]
    port: int
    log: Path

    def url(self, model: str) -> str:
        """The model's v2 infer URL."""
        return f"http://127.0.0.1:{self.port}/v2/models/{model}/infer"


def _write_repository(root: Path, name: str, onnx: Path, toml: str | None) -> Path:
    folder = root / name / "1"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.onnx").write_bytes(onnx.read_bytes())
    if toml is not None:
        (root / name / "model.toml").write_text(toml)
    return root


def start_corral(name: str, repository: Path, work: Path, extra: Sequence[str] = ()) -> Server:
    """``corral serve`` on ``repository``, HTTP only."""
    port = http_bench.free_port()
    log = work / f"{name}.log"
    argv = [
        sys.executable,
        "-c",
        "import sys; from corral.cli import main; sys.exit(main())",
        "serve",
        str(repository),
        "--host",
        "127.0.0.1",
        "--http-port",
        str(port),
        "--grpc-port",
        "-1",
        "--log-level",
        "warning",
        *extra,
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    return Server(name, server_processes.start_process(argv, log, env), port, log)


def start_fastapi(model: str, onnx: Path, work: Path) -> Server:
    """``reference/fastapi_real.py`` in the FastAPI peer's venv."""
    try:
        python = install_venv(CACHE / "fastapi", FASTAPI_PINS)
    except PeerUnavailable as exc:
        raise BenchmarkError(f"fastapi: {exc}") from exc
    port = http_bench.free_port()
    log = work / "fastapi.log"
    argv = [
        str(python),
        "-m",
        "uvicorn",
        "fastapi_real:create_app",
        "--factory",
        "--app-dir",
        str(HERE / "reference"),
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
    env = dict(os.environ, REFERENCE_MODEL_PATH=str(onnx), REFERENCE_MODEL_NAME=model)
    return Server("fastapi", server_processes.start_process(argv, log, env), port, log)


def start_mlserver(name: str, repository: Path, work: Path, batch: bool) -> Server:
    """MLServer (benchmarks/peers/mlserver.py), adaptive batching off or on (8 rows, 1 ms)."""
    from benchmarks.peers import free_port_pair
    from benchmarks.peers.mlserver import MLServerPeer

    peer = MLServerPeer(max_batch_size=8 if batch else 0, max_batch_time_s=0.001 if batch else 0)
    try:
        peer.setup(CACHE)
    except PeerUnavailable as exc:
        raise BenchmarkError(f"{name}: {exc}") from exc
    port = free_port_pair()
    started = peer.start(repository, port, work / name)
    return Server(name, started.process, port, started.log)


def start_triton(repository: Path, work: Path, home: str) -> Server:
    """Triton (benchmarks/peers/triton_ort.py) on ``repository``, which has its config.pbtxt."""
    try:
        build = triton_ort.find_build(Path(home))
    except PeerUnavailable as exc:
        raise BenchmarkError(triton_ort.not_built_line(str(exc))) from exc
    ports = (http_bench.free_port(), http_bench.free_port(), http_bench.free_port())
    log = work / "triton.log"
    return Server("triton", triton_ort.start_triton(build, repository, log, ports), ports[0], log)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and its descendants so far."""
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            times = process.cpu_times()
            total += times.user + times.system
    return total


def wait_idle(server: Server, limit_s: float = _DRAIN_LIMIT_S) -> float:
    """Wait until ``server``'s process tree is idle; the seconds it took.

    When wrk stops, the requests in flight are still being served: on a heavy model at 64
    connections, seconds of work that would otherwise run during the next target's
    measurement, on the same cores. Idle: under 5 % of one core over 250 ms.
    """
    began = time.monotonic()
    last = cpu_seconds(server.process.pid)
    while True:
        time.sleep(0.25)
        now = cpu_seconds(server.process.pid)
        if now - last < 0.0125:
            return time.monotonic() - began
        last = now
        if time.monotonic() - began > limit_s:
            raise BenchmarkError(f"{server.name} still busy {limit_s:.0f} s after the load")


def wrk_load(
    url: str, body_file: Path, payload: Payload, connections: int, seconds: float
) -> dict[str, Any]:
    """One wrk run posting ``body_file``; wrk's figures."""
    command = [
        http_bench.wrk_path(),
        f"-t{min(2, connections)}",
        f"-c{connections}",
        f"-d{max(1, round(seconds))}s",
        "--timeout",
        _WRK_TIMEOUT,
        "--latency",
        "-s",
        str(http_bench.LUA_SCRIPT),
        url,
        "--",
        str(body_file),
        payload.content_type,
    ]
    if payload.header_length is not None:
        command.append(str(payload.header_length))
    return http_bench.run_load(command, seconds)


def check(
    server: Server, model: str, payload: Payload, expected: dict[str, np.ndarray[Any, Any]]
) -> None:
    """Wait until ``server`` answers ``payload`` with onnxruntime's outputs (rtol 1e-4)."""
    path = f"/v2/models/{model}/infer"
    deadline = time.monotonic() + _READY_TIMEOUT_S
    while True:
        answer = http_bench.wait_until_answers(
            server.process,
            server.name,
            server.port,
            path,
            payload,
            server.log,
            timeout=_READY_TIMEOUT_S,
        )
        if answer[0] == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.2)  # MLServer answers 400 until its model is loaded
    status, body, header_length = answer
    if status != 200:
        raise BenchmarkError(f"{server.name} answered {status}: {body[:300]!r}")
    got = http_bench.decode_outputs(body, header_length)
    for name, values in expected.items():
        if name not in got or not np.allclose(got[name], values.ravel(), rtol=1e-4, atol=1e-5):
            raise BenchmarkError(f"{server.name}: output {name!r} differs from onnxruntime's")


# -- the side-by-side run ---------------------------------------------------------------------


@dataclass
class Settings:
    """One run's shape."""

    models: list[str]
    targets: list[str]
    connections: list[int]
    rounds: int
    duration_s: float
    mixed: bool = False
    mixed_rate: float = 100.0
    mixed_model: str = "magika"
    #: Where the Triton peer is built (None: not measured, and its targets are skipped).
    triton_home: str | None = None
    #: ``instance_group { count: N }`` in the config.pbtxt corral and Triton share.
    instance_count: int | None = None


@dataclass
class Target:
    """Something measured: a server and the body it gets, or the ceiling."""

    name: str
    server: Server | None = None
    payload: Payload | None = None
    body_file: Path | None = None
    runs: list[dict[str, Any]] = field(default_factory=list)


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@contextlib.contextmanager
def _servers(servers: list[Server]) -> Iterator[list[Server]]:
    try:
        yield servers
    finally:
        for server in servers:
            server_processes.stop_process(server.process, timeout=20)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(server.process.pid, 9)


def measure_model(
    name: str, onnx: Path, unpacked: Path, settings: Settings, work: Path
) -> dict[str, Any]:
    """Every target on one model, round by round; the figures."""
    model = MODELS[name]
    files = extra_files(unpacked, model)

    def make(rows: int) -> Feeds:
        return model.feeds(rows, files)

    feeds = make(1)
    reference = _session(onnx, 1)
    expected = dict(
        zip([o.name for o in reference.get_outputs()], reference.run(None, feeds), strict=True)
    )
    del reference
    json_body, binary_body = json_payload(feeds), binary_payload(feeds)
    wanted = list(settings.targets)
    skipped: dict[str, str] = {}
    config = None
    if any(t.startswith("triton") or t == "corral-pbtxt" for t in wanted):
        try:
            inputs, outputs = triton_ort.model_specs(onnx)
            config = triton_ort.config_pbtxt(
                name, inputs, outputs, instance_count=settings.instance_count
            )
        except PeerUnavailable as exc:
            for target in [t for t in wanted if t.startswith("triton") or t == "corral-pbtxt"]:
                skipped[target] = str(exc)
                wanted.remove(target)
    targets: list[Target] = []
    started: list[Server] = []
    folder = work / name
    folder.mkdir(parents=True, exist_ok=True)
    pbtxt: list[Path] = []

    def pbtxt_repository() -> Path:
        # Triton's and corral-pbtxt's: the model with its complete config.pbtxt.
        if not pbtxt:
            assert config is not None
            pbtxt.append(_write_repository(folder / "repo-pbtxt", name, onnx, None))
            (pbtxt[0] / name / "config.pbtxt").write_text(config)
        return pbtxt[0]

    with _servers(started):
        for target in wanted:
            if target == "ceiling":
                targets.append(Target("ceiling"))
                continue
            try:
                if target == "corral":  # the Python edge, whatever --edge auto would pick
                    repository = _write_repository(folder / "repo", name, onnx, None)
                    server = start_corral("corral", repository, folder, ["--edge", "python"])
                elif target == "corral-native":  # the native edge (corral_edge)
                    if importlib.util.find_spec("corral_edge") is None:
                        raise BenchmarkError("not measured: corral_edge is not installed")
                    repository = _write_repository(folder / "repo", name, onnx, None)
                    server = start_corral(target, repository, folder, ["--edge", "native"])
                elif target == "corral-pbtxt":
                    server = start_corral("corral-pbtxt", pbtxt_repository(), folder)
                elif target == "corral-2p":  # two processes behind the port, the cores split
                    repository = _write_repository(folder / "repo", name, onnx, None)
                    server = start_corral(target, repository, folder, ["--processes", "2"])
                elif target in (
                    "corral-binary",
                    "triton-binary",
                    "corral-2p-binary",
                    "corral-native-binary",
                ):
                    json_target = target.removesuffix("-binary")
                    sibling = next((t.server for t in targets if t.name == json_target), None)
                    if sibling is None:
                        raise BenchmarkError(f"{target} needs the {json_target} target first")
                    targets.append(Target(target, sibling, binary_body))
                    continue
                elif target == "triton":
                    if settings.triton_home is None:
                        raise BenchmarkError("not measured (--no-triton, or not built)")
                    server = start_triton(pbtxt_repository(), folder, settings.triton_home)
                elif target == "corral-tuned":
                    repository = _write_repository(folder / "repo-tuned", name, onnx, model.tuned)
                    server = start_corral("corral-tuned", repository, folder)
                elif target == "fastapi":
                    server = start_fastapi(name, onnx, folder)
                elif target in ("mlserver", "mlserver-batch"):
                    if target == "mlserver-batch" and not model.batchable:
                        skipped[target] = f"{name}'s rows are not its first dimension"
                        continue
                    repository = _write_repository(folder / "repo", name, onnx, None)
                    server = start_mlserver(target, repository, folder, target == "mlserver-batch")
                else:
                    raise BenchmarkError(f"unknown target {target!r}")
                started.append(server)
                targets.append(Target(target, server, json_body))
            except BenchmarkError as exc:
                skipped[target] = str(exc)
        for target in list(targets):
            if target.server is None or target.payload is None:
                continue
            _progress(f"{name}: checking {target.name}'s answer ...")
            try:
                check(target.server, name, target.payload, expected)
            except BenchmarkError as exc:
                # A peer that does not serve this model is left out, saying why (in the
                # report); corral answering wrongly or not at all ends the run.
                if not target.name.startswith("triton"):
                    raise
                skipped[target.name] = str(exc)[-600:]
                targets.remove(target)
                continue
            target.body_file = folder / f"{target.name}.body"
            target.body_file.write_bytes(target.payload.body)
        ceiling_rounds: list[dict[str, Any]] = []
        cell_ceiling: dict[tuple[int, int], float] = {}
        for round_index in range(settings.rounds):
            for connections in settings.connections:
                shift = round_index % max(1, len(targets))
                for target in targets[shift:] + targets[:shift]:
                    if target.server is None:
                        # Every way once a round; in the other cells the one that wins, so
                        # that each server run is paired with a ceiling measured beside it.
                        if connections == settings.connections[0]:
                            figures = ceiling_once(onnx, make, settings.duration_s, model.batchable)
                            figures["round"] = round_index
                            ceiling_rounds.append(figures)
                            cell_ceiling[round_index, connections] = figures["rows_per_s"]
                            what = figures["best"]
                        else:
                            cell_ceiling[round_index, connections] = ceiling_cell(
                                onnx, make, settings.duration_s
                            )
                            what = f"{CORES} x 1 thread, batch 1"
                        _progress(
                            f"round {round_index + 1} {name} ceiling c={connections}: "
                            f"{cell_ceiling[round_index, connections]:,.1f} rows/s ({what})"
                        )
                        continue
                    assert target.payload is not None
                    assert target.body_file is not None
                    cpu = cpu_seconds(target.server.process.pid)
                    # One process's statistics: not the group's under --processes 2.
                    is_corral = target.name.startswith("corral") and "-2p" not in target.name
                    stats = corral_stats(target.server.port, name) if is_corral else None
                    result = wrk_load(
                        target.server.url(name),
                        target.body_file,
                        target.payload,
                        connections,
                        settings.duration_s,
                    )
                    cpu = cpu_seconds(target.server.process.pid) - cpu
                    drain_s = wait_idle(target.server)
                    seconds = result["duration_us"] / 1e6
                    errors = sum(result["errors"].values())
                    if result["requests"] == 0:
                        raise BenchmarkError(
                            f"{name} {target.name} c={connections}: no request answered within "
                            f"the {settings.duration_s:g} s run; give it a longer --duration"
                        )
                    run = {
                        "round": round_index,
                        "connections": connections,
                        "requests_per_s": result["requests"] / seconds if seconds else 0.0,
                        "p50_ms": result["latency_us"]["p50"] / 1000,
                        "p99_ms": result["latency_us"]["p99"] / 1000,
                        "mean_ms": result["latency_us"]["mean"] / 1000,
                        "cpu_s_per_request": cpu / result["requests"]
                        if result["requests"]
                        else None,
                        "errors": errors,
                        "drain_s": drain_s,
                        "load_1min": os.getloadavg()[0],
                    }
                    if stats is not None:
                        run["inside"] = stats_delta(stats, corral_stats(target.server.port, name))
                    target.runs.append(run)
                    _progress(
                        f"round {round_index + 1} {name} {target.name} c={connections}: "
                        f"{run['requests_per_s']:,.1f} req/s, p99 {run['p99_ms']:.1f} ms"
                        f"{f', {errors} errors' if errors else ''}"
                    )
    for target in targets:
        for run in target.runs:
            ceiling = cell_ceiling.get((run["round"], run["connections"]))
            run["vs_ceiling"] = run["requests_per_s"] / ceiling if ceiling else None
    return {
        "model": name,
        "wheel": model.wheel.pin,
        "member": model.member,
        "inputs": model.note,
        "tuned": model.tuned.strip().replace("\n", "; "),
        "json_body_bytes": len(json_body.body),
        "rounds": settings.rounds,
        "duration_s": settings.duration_s,
        "instance_count": settings.instance_count,
        "targets": {t.name: summarize(t.runs) for t in targets if t.server is not None},
        "load_1min_during": [run["load_1min"] for t in targets for run in t.runs],
        "ceiling": _ceiling_summary(ceiling_rounds),
        "skipped": skipped,
    }


def corral_stats(port: int, model: str) -> dict[str, Any]:
    """Corral's statistics of ``model`` (the v2 statistics extension), its one version."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("GET", f"/v2/models/{model}/stats")
        response = connection.getresponse()
        body = response.read()
    finally:
        connection.close()
    if response.status != 200:
        raise BenchmarkError(f"/v2/models/{model}/stats answered {response.status}: {body!r}")
    (row,) = orjson.loads(body)["model_stats"]
    stats: dict[str, Any] = row
    return stats


def stats_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
    """Where a run's requests spent their time inside corral's Host, per request (ms).

    ``rows_per_run``: requests per model run (batching); ``queue_ms``: waiting for a compute
    worker; ``compute_infer_ms``: the model run each request was part of; ``host_ms``: from
    submission to answer. The rest of wrk's latency is the HTTP path and the event loop.
    """
    requests = after["inference_count"] - before["inference_count"]
    runs = after["execution_count"] - before["execution_count"]
    figures = {"rows_per_run": requests / runs if runs else 0.0}
    for key, label in (
        ("success", "host_ms"),
        ("queue", "queue_ms"),
        ("compute_input", "compute_input_ms"),
        ("compute_infer", "compute_infer_ms"),
        ("compute_output", "compute_output_ms"),
    ):
        was, now = before["inference_stats"][key], after["inference_stats"][key]
        count = now["count"] - was["count"]
        figures[label] = (now["ns"] - was["ns"]) / count / 1e6 if count else 0.0
    return figures


def summarize(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Medians over rounds per connection count."""
    cells: dict[int, list[dict[str, Any]]] = {}
    for run in runs:
        cells.setdefault(run["connections"], []).append(run)
    return [
        {
            "connections": connections,
            "requests_per_s": statistics.median(r["requests_per_s"] for r in cell),
            "p50_ms": statistics.median(r["p50_ms"] for r in cell),
            "p99_ms": statistics.median(r["p99_ms"] for r in cell),
            "mean_ms": statistics.median(r.get("mean_ms", 0.0) for r in cell),
            "vs_ceiling": statistics.median(r["vs_ceiling"] for r in cell)
            if all(r.get("vs_ceiling") for r in cell)
            else None,
            "cpu_s_per_request": statistics.median(r["cpu_s_per_request"] or 0.0 for r in cell),
            "errors": sum(r["errors"] for r in cell),
            **(
                {
                    "inside": {
                        key: statistics.median(r["inside"][key] for r in cell)
                        for key in cell[0]["inside"]
                    }
                }
                if "inside" in cell[0]
                else {}
            ),
        }
        for connections, cell in sorted(cells.items())
    ]


def _ceiling_summary(rounds: Sequence[dict[str, Any]]) -> dict[str, Any]:
    if not rounds:
        return {}
    ways = rounds[0]["ways"].keys()
    return {
        "rows_per_s": statistics.median(r["rows_per_s"] for r in rounds),
        "ways": {
            way: {
                key: statistics.median(r["ways"][way][key] for r in rounds)
                for key in ("rows_per_s", "cpu_s_per_row", "p50_ms", "p99_ms")
            }
            for way in ways
        },
        "ms_per_row_one_thread": {
            batch: statistics.median(r["ms_per_row_one_thread"][batch] for r in rounds)
            for batch in rounds[0]["ms_per_row_one_thread"]
        },
    }


# -- the mixed load ---------------------------------------------------------------------------


class _Connection:
    """One keep-alive HTTP/1.1 connection posting v2 JSON bodies.

    No HTTP library: httpx's client, at 100 requests/s on this loaded 2-core machine, was
    itself the bottleneck (p50 167 ms against 3 ms with this one).
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        self.writer.write(head + body)
        header = await self.reader.readuntil(b"\r\n\r\n")
        lines = header.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        length = next(
            int(line.split(":", 1)[1])
            for line in lines[1:]
            if line.lower().startswith("content-length:")
        )
        return status, await self.reader.readexactly(length)


async def _steady(
    port: int, names: Sequence[str], body: bytes, rate: float, seconds: float
) -> dict[str, Any]:
    """Open loop: one request every 1/rate s over the tiny models in turn.

    Latencies are from each request's scheduled time (a request waiting for one of the 32
    connections is late, and its latency says so). Any answer but 200 stops the benchmark.
    """
    loop = asyncio.get_running_loop()
    free: asyncio.Queue[_Connection] = asyncio.Queue()
    for _ in range(32):
        free.put_nowait(_Connection(*await asyncio.open_connection("127.0.0.1", port)))
    latencies: list[float] = []

    async def one(name: str, due: float) -> None:
        connection = await free.get()
        try:
            status, answer = await connection.post(f"/v2/models/{name}/infer", body)
        finally:
            free.put_nowait(connection)
        if status != 200:
            raise BenchmarkError(f"mixed load: {name} answered {status}: {answer[:200]!r}")
        latencies.append(loop.time() - due)

    tasks = []
    start = loop.time()
    try:
        for index in range(int(rate * seconds)):
            due = start + index / rate
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(names[index % len(names)], due)))
        await asyncio.gather(*tasks)
    finally:
        while not free.empty():
            free.get_nowait().writer.close()
    ms = np.asarray(latencies) * 1000
    return {
        "requests": len(latencies),
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
    }


async def _load_all(port: int, names: Sequence[str], body: bytes) -> None:
    """One request per model, 8 at a time (closed loop); fails on any answer but 200."""
    import httpx

    pending = list(names)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:

        async def worker() -> None:
            while pending:
                name = pending.pop()
                response = await client.post(
                    f"/v2/models/{name}/infer",
                    content=body,
                    headers={"content-type": "application/json"},
                )
                if response.status_code != 200:
                    raise BenchmarkError(f"{name}: {response.status_code} {response.text[:200]}")

        await asyncio.gather(*(worker() for _ in range(8)))


def _saturate(
    holder: dict[str, Any],
    url: str,
    body_file: Path,
    payload: Payload,
    connections: int,
    *,
    seconds: float,
) -> None:
    # wrk's figures go into holder; an error there too, for the caller to raise.
    try:
        holder.update(wrk_load(url, body_file, payload, connections, seconds))
    except BenchmarkError as exc:
        holder["error"] = exc


def measure_mixed(
    onnx: Path, model: RealModel, unpacked: Path, settings: Settings, work: Path
) -> dict[str, Any]:
    """1,000 tiny models at a steady rate, alone and beside the real model at saturation."""
    from benchmarks.footprint import build_repository

    repository = work / "mixed"
    names = [path.parent.parent.name for path in build_repository(repository, 1000)]
    _write_repository(repository, model.name, onnx, None)
    tiny = json.dumps(
        {
            "inputs": [
                {"name": "X", "datatype": "FP32", "shape": [1, 4], "data": [0.0, 0.25, 0.5, 0.75]}
            ]
        }
    ).encode()
    payload = json_payload(model.feeds(1, extra_files(unpacked, model)))
    body_file = work / "mixed-heavy.body"
    body_file.write_bytes(payload.body)
    heavy_connections = 32
    rounds: list[dict[str, Any]] = []
    with _servers([start_corral("corral-mixed", repository, work)]) as (server,):
        http_bench.wait_until_answers(
            server.process,
            server.name,
            server.port,
            f"/v2/models/{model.name}/infer",
            payload,
            server.log,
        )
        # Every tiny model loaded once, so that the figures are of serving, not of loading.
        asyncio.run(_load_all(server.port, names, tiny))
        for round_index in range(settings.rounds):
            alone = asyncio.run(
                _steady(server.port, names, tiny, settings.mixed_rate, settings.duration_s)
            )
            holder: dict[str, Any] = {}
            thread = threading.Thread(
                target=_saturate,
                args=(holder, server.url(model.name), body_file, payload, heavy_connections),
                kwargs={"seconds": settings.duration_s + 1},
            )
            thread.start()
            time.sleep(0.5)  # let the heavy load reach saturation before the steady rate starts
            loaded = asyncio.run(
                _steady(server.port, names, tiny, settings.mixed_rate, settings.duration_s)
            )
            thread.join()
            if "error" in holder:
                raise holder["error"]
            heavy = holder["requests"] / (holder["duration_us"] / 1e6)
            rounds.append({"alone": alone, "loaded": loaded, "heavy_requests_per_s": heavy})
            _progress(
                f"mixed round {round_index + 1}: tiny p99 alone {alone['p99_ms']:.1f} ms, "
                f"with {model.name} saturated {loaded['p99_ms']:.1f} ms ({heavy:,.1f} req/s)"
            )
    return {
        "heavy_model": model.name,
        "heavy_connections": heavy_connections,
        "tiny_models": len(names),
        "tiny_rate_per_s": settings.mixed_rate,
        "rounds": rounds,
        "tiny_p99_alone_ms": statistics.median(r["alone"]["p99_ms"] for r in rounds),
        "tiny_p99_loaded_ms": statistics.median(r["loaded"]["p99_ms"] for r in rounds),
        "tiny_p50_alone_ms": statistics.median(r["alone"]["p50_ms"] for r in rounds),
        "tiny_p50_loaded_ms": statistics.median(r["loaded"]["p50_ms"] for r in rounds),
        "heavy_requests_per_s": statistics.median(r["heavy_requests_per_s"] for r in rounds),
    }


def _mlserver_pins() -> tuple[str, ...]:
    from benchmarks.peers.mlserver import PINS

    return PINS


def measure(settings: Settings) -> dict[str, Any]:
    """The whole run; the JSON document."""
    http_bench.wrk_path()
    names = list(
        dict.fromkeys([*settings.models, *([settings.mixed_model] if settings.mixed else [])])
    )
    files, unpacked = fetch_models(names)
    load_before = os.getloadavg()
    models = []
    with tempfile.TemporaryDirectory(prefix="corral-bench-real-") as scratch:
        work = Path(scratch)
        for name in settings.models:
            models.append(measure_model(name, files[name], unpacked, settings, work))
        mixed = (
            measure_mixed(
                files[settings.mixed_model], MODELS[settings.mixed_model], unpacked, settings, work
            )
            if settings.mixed
            else None
        )
    import onnxruntime

    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpus": CORES,
            "platform": platform.platform(),
            "python": platform.python_version(),
            "load_average_before": load_before,
            "load_average_after": os.getloadavg(),
        },
        "versions": {
            "corral": importlib.metadata.version("corral"),
            "onnxruntime": onnxruntime.__version__,
            "wrk": http_bench.wrk_version(http_bench.wrk_path()),
            "fastapi venv": ", ".join(FASTAPI_PINS),
            **(
                {"mlserver venv": ", ".join(_mlserver_pins())}
                if any(t.startswith("mlserver") for t in settings.targets)
                else {}
            ),
            "wheels": sorted({MODELS[name].wheel.pin for name in names}),
            **(
                {"triton": triton_ort.find_build(Path(settings.triton_home)).describe()}
                if settings.triton_home is not None
                else {}
            ),
        },
        "settings": vars(settings),
        "models": models,
        "mixed": mixed,
    }


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add(
        "--quick",
        action="store_true",
        help="magika, 1 round of 1 s at 8 connections, corral and the ceiling",
    )
    add(
        "--models",
        help=f"comma-separated, of {', '.join(MODELS)} (default {','.join(DEFAULT_MODELS)})",
    )
    add(
        "--targets",
        help="comma-separated (default corral,corral-binary,corral-tuned,fastapi,ceiling, and "
        "corral-native,corral-native-binary when corral_edge is installed)",
    )
    add("--mlserver", action="store_true", help="add mlserver and mlserver-batch to the targets")
    add(
        "--no-triton",
        action="store_true",
        help="leave Triton out even when it is built (by default triton and triton-binary are "
        "added to the targets when make triton-peer has built them; not with --quick)",
    )
    add(
        "--instance-count",
        type=int,
        help="with Triton: instance_group { count: N } in the config.pbtxt corral and Triton read",
    )
    add("--connections", help="comma-separated (default 1,8,32,64)")
    add("--rounds", type=int, help="rounds (default 3)")
    add("--duration", type=float, help="seconds per run (default 3)")
    add(
        "--mixed", action="store_true", help="add the mixed load (1,000 tiny models + one real one)"
    )
    add("--mixed-model", default="magika", help="the real model of the mixed load (magika)")
    add("--mixed-rate", type=float, default=100.0, help="tiny models' requests/s (100)")
    add("--json", type=Path, help="where to write the results")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run; write JSON under benchmarks/results/ (or --json); 3 if the wheels are unavailable."""
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["render"]:
        renderer = argparse.ArgumentParser(prog="real_models.py render")
        renderer.add_argument("results", type=Path, nargs="+", help="this script's JSON files")
        renderer.add_argument("--out", type=Path, default=Path("docs"), help="folder (docs)")
        options = renderer.parse_args(argv[1:])
        render(options.results, options.out)
        print(f"wrote {options.out / 'benchmarks.md'} and {options.out / PLOT}")
        return 0
    args = _parser().parse_args(argv)
    targets = (
        args.targets
        or ("corral,ceiling" if args.quick else "corral,corral-binary,corral-tuned,fastapi,ceiling")
    ).split(",")
    if not args.targets and not args.quick and importlib.util.find_spec("corral_edge"):
        targets += ["corral-native", "corral-native-binary"]  # the native edge, when built
    if args.mlserver:
        targets += ["mlserver", "mlserver-batch"]
    triton_home, triton_note = None, None
    if not args.no_triton and (not args.quick or any(t.startswith("triton") for t in targets)):
        triton_home, triton_note = http_bench.triton_home_or_note(["triton-json"])
    if triton_note is not None:
        print(triton_note, file=sys.stderr)
    elif triton_home is not None and not args.targets:
        targets += ["triton", "triton-binary", "corral-pbtxt"]
    models = (args.models or ("magika" if args.quick else ",".join(DEFAULT_MODELS))).split(",")
    unknown = [name for name in models if name not in MODELS] + (
        [args.mixed_model] if args.mixed_model not in MODELS else []
    )
    if unknown:
        print(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}", file=sys.stderr)
        return 2
    settings = Settings(
        models=models,
        targets=targets,
        connections=[
            int(c) for c in (args.connections or ("8" if args.quick else "1,8,32,64")).split(",")
        ],
        rounds=args.rounds or (1 if args.quick else 3),
        duration_s=args.duration or (1.0 if args.quick else 3.0),
        mixed=args.mixed,
        mixed_rate=args.mixed_rate,
        mixed_model=args.mixed_model,
        triton_home=triton_home,
        instance_count=args.instance_count,
    )
    try:
        document = measure(settings)
    except ModelsUnavailable as exc:
        print(f"the real models are unavailable: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    target = args.json or RESULTS / f"real-{'quick' if args.quick else 'full'}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(document, indent=2) + "\n")
    print(format_report(document))
    print(f"results written to {target}")
    return 0


#: corral's targets beside Triton's, loaded alike.
TRITON_PAIRS = (
    ("corral", "triton"),
    ("corral-binary", "triton-binary"),
    ("corral-pbtxt", "triton"),
    ("corral-2p", "triton"),
    ("corral-2p-binary", "triton-binary"),
    ("corral-native", "triton"),
    ("corral-native-binary", "triton-binary"),
)


def triton_lines(model: dict[str, Any]) -> list[str]:
    """The corral targets beside Triton's on one model, per body and connections; [] if none.

    The ratios are of the medians over rounds; CPU per request is each server process
    tree's, in microseconds.
    """
    targets = model["targets"]
    lines = []
    for corral, triton in TRITON_PAIRS:
        if corral not in targets or triton not in targets:
            continue
        theirs = {row["connections"]: row for row in targets[triton]}
        for row in targets[corral]:
            other = theirs.get(row["connections"])
            if other is None or not other["requests_per_s"]:
                continue
            lines.append(
                f"| {corral} / {triton} | {row['connections']} | "
                f"{row['requests_per_s'] / other['requests_per_s']:.2f}x | "
                f"{row['p99_ms']:.1f} / {other['p99_ms']:.1f} | "
                f"{row['cpu_s_per_request'] * 1e6:,.0f} / {other['cpu_s_per_request'] * 1e6:,.0f} |"
            )
    if not lines:
        return []
    return [
        "| corral beside Triton | connections | requests/s ratio | p99 ms | "
        "server CPU µs/request |",
        "|---|---:|---:|---:|---:|",
        *lines,
    ]


def format_report(document: dict[str, Any]) -> str:
    """The figures as Markdown tables (the ones docs/benchmarks.md shows)."""
    lines = []
    for model in document["models"]:
        ceiling = model["ceiling"].get("rows_per_s")
        instances = model.get("instance_count")
        pool = (
            f", `instance_group {{ count: {instances} }}` in the config.pbtxt" if instances else ""
        )
        lines += [
            f"#### {model['model']}{pool}",
            "",
            f"`{model['member']}` from `{model['wheel']}`; inputs: {model['inputs']}; JSON body "
            f"{model['json_body_bytes']:,} bytes; corral-tuned's model.toml: `{model['tuned']}`; "
            f"{model.get('rounds', '?')} round(s) of {model.get('duration_s', '?')} s per cell.",
            "",
            "| target | connections | requests/s | p50 ms | p99 ms | CPU ms/request | vs ceiling |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for name, rows in model["targets"].items():
            for row in rows:
                ratio = f"{row['vs_ceiling']:.2f}x" if row.get("vs_ceiling") else "-"
                lines.append(
                    f"| {name} | {row['connections']} | {row['requests_per_s']:,.1f} | "
                    f"{row['p50_ms']:.1f} | "
                    f"{row['p99_ms']:.1f} | {row['cpu_s_per_request'] * 1000:.2f} | {ratio} |"
                )
        inside = [
            (name, row)
            for name, rows in model["targets"].items()
            for row in rows
            if "inside" in row
        ]
        if inside:
            lines += [
                "",
                "| inside corral (per request) | connections | requests per run | queue ms | "
                "run ms | Host ms | the rest: HTTP, JSON, event loop (mean latency - Host) ms |",
                "|---|---:|---:|---:|---:|---:|---:|",
            ]
            for name, row in inside:
                figures = row["inside"]
                lines.append(
                    f"| {name} | {row['connections']} | {figures['rows_per_run']:.1f} | "
                    f"{figures['queue_ms']:.1f} | {figures['compute_infer_ms']:.1f} | "
                    f"{figures['host_ms']:.1f} | {row['mean_ms'] - figures['host_ms']:.1f} |"
                )
        if ceiling:
            ways = model["ceiling"]["ways"]
            lines.append("")
            lines.append("| ceiling (in-process) | rows/s | CPU ms/row | p50 ms/run | p99 ms/run |")
            lines.append("|---|---:|---:|---:|---:|")
            for way, figures in ways.items():
                lines.append(
                    f"| {way} | {figures['rows_per_s']:,.1f} | "
                    f"{figures['cpu_s_per_row'] * 1000:.2f} | {figures['p50_ms']:.1f} | "
                    f"{figures['p99_ms']:.1f} |"
                )
            per_row = model["ceiling"]["ms_per_row_one_thread"]
            lines.append("")
            lines.append(
                "CPU ms per row on one thread: "
                + ", ".join(f"batch {b}: {ms:.2f}" for b, ms in per_row.items())
            )
        beside = triton_lines(model)
        if beside:
            lines += ["", *beside]
        for name, reason in model["skipped"].items():
            lines.append(f"\n{name}: skipped: {reason}")
        lines.append("")
    mixed = document.get("mixed")
    if mixed:
        lines += [
            f"Mixed load: {mixed['tiny_models']} tiny models at {mixed['tiny_rate_per_s']:.0f} "
            f"requests/s (open loop) beside {mixed['heavy_model']} driven by wrk at "
            f"{mixed['heavy_connections']} connections ({mixed['heavy_requests_per_s']:,.1f} "
            "requests/s), one corral serve with its defaults:",
            "",
            "| round | tiny p50 alone ms | tiny p99 alone ms | tiny p50 loaded ms | "
            "tiny p99 loaded ms | p99 loaded / alone |",
            "|---:|---:|---:|---:|---:|---:|",
        ]
        for index, r in enumerate(mixed["rounds"], 1):
            lines.append(
                f"| {index} | {r['alone']['p50_ms']:.1f} | {r['alone']['p99_ms']:.1f} | "
                f"{r['loaded']['p50_ms']:.1f} | {r['loaded']['p99_ms']:.1f} | "
                f"{r['loaded']['p99_ms'] / r['alone']['p99_ms']:.1f}x |"
            )
        lines += ["", f"Median of the rounds' ratios: {mixed_ratio(mixed):.1f}x (goal <= 3x)."]
    return "\n".join(lines)


# -- the page ---------------------------------------------------------------------------------

#: The generated part of docs/benchmarks.md's "Real models" section lies between these
#: markers; render_peers.py keeps everything from BEGIN on when it rewrites the page.
BEGIN = "<!-- real-models: begin (written by benchmarks/real_models.py render) -->"
END = "<!-- real-models: end -->"
PLOT = "benchmarks-real.png"
_PEERS = ("fastapi", "mlserver", "mlserver-batch", "triton", "triton-binary")


def mixed_ratio(mixed: dict[str, Any]) -> float:
    """The tiny models' p99 with the heavy load over their p99 alone, median over rounds.

    Each round's ratio pairs two runs back to back, so that a spike in one round's "alone"
    run moves one ratio only.
    """
    return statistics.median(r["loaded"]["p99_ms"] / r["alone"]["p99_ms"] for r in mixed["rounds"])


def goals(document: dict[str, Any]) -> list[str]:
    """Issue 20's goals, each checked against the run: one line each."""
    lines = []
    for model in document["models"]:
        targets = model["targets"]
        for variant in ("corral", "corral-binary"):
            for row in targets.get(variant, []):
                connections = row["connections"]
                if connections < 8:
                    continue
                ratio = row.get("vs_ceiling") or float("nan")
                peers = [
                    next(r for r in rows if r["connections"] == connections)
                    for name, rows in targets.items()
                    if name in _PEERS
                ]
                ahead = all(row["requests_per_s"] > peer["requests_per_s"] for peer in peers)
                lowest = all(row["p99_ms"] <= peer["p99_ms"] for peer in peers)
                lines.append(
                    f"- {model['model']}, {connections} connections, {variant}: {ratio:.2f}x "
                    f"the ceiling ({'met' if ratio >= 0.95 else 'not met'}); ahead of every "
                    f"peer in requests/s: {'yes' if ahead else 'no'}; lowest p99: "
                    f"{'yes' if lowest else 'no'}"
                )
    mixed = document.get("mixed")
    if mixed:
        ratio = mixed_ratio(mixed)
        lines.append(
            f"- mixed load: tiny models' p99 {ratio:.1f}x alone with {mixed['heavy_model']} "
            f"saturated (goal <= 3x: {'met' if ratio <= 3 else 'not met'})"
        )
    return lines


def section(document: dict[str, Any]) -> str:
    """The generated part of the "Real models" section, markers included."""
    machine, versions = document["machine"], document["versions"]
    before = ", ".join(f"{x:.1f}" for x in machine["load_average_before"])
    after = ", ".join(f"{x:.1f}" for x in machine["load_average_after"])
    during = [x for model in document["models"] for x in model.get("load_1min_during", [])]
    during_median = statistics.median(during) if during else float("nan")
    during_max = max(during, default=float("nan"))
    lines = [
        BEGIN,
        "",
        f"Measured {document['date']} on {machine['cpus']} CPUs ({machine['platform']}, Python "
        f"{machine['python']}); load average (1, 5, 15 min) {before} before and {after} after: "
        "the machine was shared with other work throughout (1-minute load average during the "
        f"runs: median {during_median:.1f}, highest {during_max:.1f}). "
        "Targets in turn within each round, each server idle again before the next run "
        "starts; medians over rounds shown (rounds and seconds per run under each model).",
        "",
        "Versions: "
        + "; ".join(
            f"{key} {', '.join(value) if isinstance(value, list) else value}"
            for key, value in versions.items()
        )
        + ".",
        "",
        "Made by `make bench-real` (`benchmarks/real_models.py`, then `python "
        "benchmarks/real_models.py render RESULTS --out docs`). Each model comes from its "
        "wheel on PyPI, pinned (`pip download --no-deps`), and is served alone by each target "
        "on 127.0.0.1, driven by wrk (`benchmarks/infer.lua`, closed loop, `--timeout 30s`) "
        "with one realistic request (its inputs are named under each table); every target's "
        "answer is first checked against onnxruntime's. `corral`: `corral serve` with its "
        "defaults, JSON bodies; `corral-binary`: the same process, the binary tensor "
        "extension; `corral-tuned`: its model.toml set as shown; `fastapi`: "
        "`benchmarks/reference/fastapi_real.py`, a `def` endpoint with pydantic models around "
        "the default `InferenceSession`; `mlserver` / `mlserver-batch`: MLServer with an "
        "onnxruntime runtime (one intra-op thread per session), adaptive batching off / on "
        "(8 rows, 1 ms); `triton` / `triton-binary` (when built, `make triton-peer`): NVIDIA "
        "Triton 2.51 with its C++ onnxruntime backend r24.10, one global onnxruntime pool of "
        "one thread, on a copy of the model with a config.pbtxt written from its signature "
        "(max_batch_size 0), which `corral-pbtxt` serves too. The ceiling is onnxruntime "
        "in the benchmark's process, no HTTP: the "
        "best of one session with intra-op threads = cores at batch 1, 8 and 32 and one "
        "single-threaded session per core from a thread each, all measured in each round's "
        "first cell; in every other cell the latter alone (it won on every model here), so "
        "that `vs ceiling` is the median over rounds of a server's requests/s over the "
        "ceiling's rows/s measured in the same round and cell, beside it. CPU ms/request: "
        "the server's process tree, user + system, over the run.",
        "",
        "**Read with care:** wrk, the servers idling beside the one measured and other work "
        "share the same cores; only ratios within this run compare. Image inputs in JSON are "
        "megabytes of text (the body size is under each table): for those models the JSON "
        "targets measure decoding as much as the model.",
        "",
        f"![requests/s by connections, per model]({PLOT})",
        "",
        format_report(document),
        "",
        "Goals (issue 20), from these figures:",
        "",
        *goals(document),
        "",
        END,
    ]
    return "\n".join(lines)


def plot(document: dict[str, Any], out: Path) -> None:
    """Requests/s by connections, one panel per model, the ceiling as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = document["models"]
    figure, axes = plt.subplots(1, len(models), figsize=(4.2 * len(models), 3.8), squeeze=False)
    for axis, model in zip(axes[0], models, strict=True):
        for name, rows in model["targets"].items():
            axis.plot(
                [row["connections"] for row in rows],
                [row["requests_per_s"] for row in rows],
                marker="o",
                label=name,
            )
        if model["ceiling"]:
            axis.axhline(
                model["ceiling"]["rows_per_s"], linestyle="--", color="black", label="ceiling"
            )
        axis.set_xscale("log", base=2)
        axis.set_title(model["model"])
        axis.set_xlabel("connections")
        axis.set_ylim(bottom=0)
    axes[0][0].set_ylabel("requests/s (median)")
    axes[0][-1].legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(out / PLOT, dpi=90)
    plt.close(figure)


def merge(documents: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Several runs as one page: the first's header, every run's models, the first mixed load.

    The load averages shown are the lowest "before" and the highest "after" of the runs.
    """
    merged = dict(documents[0])
    merged["models"] = [model for document in documents for model in document["models"]]
    merged["mixed"] = next((d["mixed"] for d in documents if d.get("mixed")), None)
    machine = dict(merged["machine"])
    machine["load_average_before"] = min(d["machine"]["load_average_before"] for d in documents)
    machine["load_average_after"] = max(d["machine"]["load_average_after"] for d in documents)
    merged["machine"] = machine
    wheels = sorted({pin for d in documents for pin in d["versions"].get("wheels", [])})
    merged["versions"] = {**merged["versions"], "wheels": wheels}
    return merged


def render(results: Sequence[Path], out: Path, *, with_plot: bool = True) -> None:
    """Write the section into ``out``/benchmarks.md (replacing the markers' part) + the plot."""
    document = merge([json.loads(path.read_text()) for path in results])
    page = out / "benchmarks.md"
    text = page.read_text()
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        tail = rest.split(END, 1)[1]
        text = head + section(document) + tail
    else:
        text = text.rstrip("\n") + "\n\n## Real models\n\n" + section(document) + "\n"
    page.write_text(text)
    if with_plot:
        plot(document, out)


if __name__ == "__main__":
    sys.exit(main())
