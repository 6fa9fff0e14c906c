"""The demo behind ``corral demo``: many small models, corral against onnxruntime's defaults.

Both engines load the same folder of tiny models and serve the same batch-1 workload from
the same number of threads; each one runs in a fresh interpreter (:func:`run_worker`),
because onnxruntime's global thread pools, once corral sets them, make sessions with
onnxruntime's default options fail in that process. What each worker measures is a
:class:`WorkerResult`: threads, memory, load time, throughput and CPU burnt while idle.

Example::

    from corral.demo import run_demo
    result = run_demo(count=200, threads=4, requests=5000)
    print(result.corral.throughput, result.onnxruntime.throughput)

The worker is also a command (it prints one JSON line)::

    python -m corral.demo worker --engine corral --models DIR --threads 8 --requests 20000
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args

import numpy as np

from corral._base import install_hint
from corral.testing import ModelKind, build_model

__all__ = [
    "ENGINES",
    "IDLE_WINDOW_S",
    "N_FEATURES",
    "DemoProgress",
    "DemoResult",
    "DemoStep",
    "Engine",
    "WorkerFailed",
    "WorkerResult",
    "build_models",
    "demo_model",
    "measure_engine",
    "run_demo",
    "run_worker",
    "run_worker_process",
]

#: ``corral``: corral Sessions on one Runtime; ``onnxruntime``: InferenceSessions with defaults.
Engine = Literal["corral", "onnxruntime"]
ENGINES: tuple[Engine, ...] = get_args(Engine)

#: What :func:`run_demo` reports progress on: the models it writes, then each engine's worker.
DemoStep = Literal["build", "corral", "onnxruntime"]
#: ``progress(step, done, total)``. ``build`` counts models written; an engine's step reports
#: ``0`` of ``1`` when its worker starts and ``1`` of ``1`` when it has finished.
DemoProgress = Callable[[DemoStep, int, int], None]

Parsed = TypeVar("Parsed")

#: Every demo model takes ``X`` float32 ``[N, N_FEATURES]`` and answers ``Y`` float32 ``[N, 1]``.
N_FEATURES = 4

_MODEL_KINDS: tuple[ModelKind, ...] = ("tree", "linear", "mlp")
#: Seconds a worker idles after its workload while its CPU time is measured, by default: long
#: enough for onnxruntime's pool threads to stop spinning after the last run (they spin for a
#: few milliseconds), short enough not to drag the demo out. Tests pass a shorter one.
IDLE_WINDOW_S = 2.0


class WorkerFailed(RuntimeError):
    """A demo worker process failed or timed out; the message carries its stderr.

    Not a :class:`corral.CorralError`: it reports on the demo's own worker processes, not on
    anything the library does, and ``corral demo`` reports it as such.
    """


@dataclass(frozen=True)
class WorkerResult:
    """What one engine's worker measured, in its own process."""

    #: ``corral`` or ``onnxruntime``.
    engine: str
    #: Models loaded, one session each.
    sessions: int
    #: Workload threads, also the threads that loaded the models.
    threads: int
    #: OS threads of the process before loading (after importing onnxruntime).
    threads_before: int
    #: OS threads once every session is loaded and the loading threads are gone.
    threads_after_load: int
    #: Resident memory before loading, in bytes.
    rss_before: int
    #: Resident memory once every session is loaded, in bytes.
    rss_after_load: int
    #: ``(rss_after_load - rss_before) / sessions``, in bytes.
    rss_per_session: float
    #: Wall time to load every session.
    load_seconds: float
    #: Runs completed by the workload.
    requests: int
    #: Wall time of the workload, from the moment every thread was ready to the last run.
    run_seconds: float
    #: ``requests / run_seconds``.
    throughput: float
    #: Process CPU time over an idle window after the workload, as a percentage of the
    #: window's wall time (100 = one core busy).
    idle_cpu_percent: float
    #: OS threads once the workload threads have ended.
    threads_after_run: int
    #: Wall time to release every session (for corral, including the Runtime's shutdown).
    close_seconds: float

    @classmethod
    def from_json(cls, line: str) -> WorkerResult:
        """Parse the JSON line a worker prints; raises ValueError if a field is missing."""
        data = json.loads(line)
        names = [field.name for field in fields(cls)]
        missing = [name for name in names if name not in data]
        if missing:
            raise ValueError(f"worker result lacks {', '.join(missing)}: {line!r}")
        return cls(**{name: data[name] for name in names})


@dataclass(frozen=True)
class DemoResult:
    """Both engines' results for one demo run."""

    models: int
    threads: int
    requests: int
    corral: WorkerResult
    onnxruntime: WorkerResult

    def to_dict(self) -> dict[str, Any]:
        """The result as plain JSON-ready data."""
        return asdict(self)


def demo_model(index: int) -> bytes:
    """The ``index``-th demo model: a tree, a linear model and an MLP in turn, seeded by ``index``.

    Each takes ``X`` float32 ``[N, N_FEATURES]``. The same index always gives the same bytes.

    Example::

        Path("m.onnx").write_bytes(demo_model(41))  # an MLP (41 % 3 == 2)
    """
    kind = _MODEL_KINDS[index % len(_MODEL_KINDS)]
    return build_model(kind, n_features=N_FEATURES, seed=index)


def build_models(
    folder: str | Path, count: int, progress: Callable[[int], None] | None = None
) -> list[Path]:
    """Write ``count`` tiny models (tree, linear, MLP in turn) as ``folder/model-00001.onnx`` ...

    The models are :func:`demo_model` ``(0)``, ``(1)`` ... ``progress(n)`` is called after
    each model with the number written so far. Returns the paths in order.
    """
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for index in range(count):
        path = folder / f"model-{index + 1:05d}.onnx"
        path.write_bytes(demo_model(index))
        paths.append(path)
        if progress is not None:
            progress(index + 1)
    return paths


def run_demo(
    count: int = 1000,
    threads: int = 8,
    requests: int = 20000,
    folder: str | Path | None = None,
    progress: DemoProgress | None = None,
    *,
    seed: int = 0,
    worker_timeout: float = 900.0,
    idle_window_s: float = IDLE_WINDOW_S,
) -> DemoResult:
    """Build ``count`` models and measure both engines on them, one worker process each.

    The models go to a temporary folder removed afterwards, or to ``folder`` (kept), which
    must not already hold ``.onnx`` files: the workers load every model in it. Each worker is
    killed after ``worker_timeout`` seconds; each measures idle CPU over ``idle_window_s``
    seconds after its workload. Raises :class:`WorkerFailed` with the worker's
    stderr if one fails.
    """
    for name, value in (("count", count), ("threads", threads), ("requests", requests)):
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
    # Fail before building models rather than in the workers.
    if importlib.util.find_spec("psutil") is None:
        raise ImportError(f"the demo needs psutil (the demo extra): {install_hint('demo')}")

    def on_built(done: int) -> None:
        if progress is not None:
            progress("build", done, count)

    def measure(models_dir: Path) -> DemoResult:
        build_models(models_dir, count, on_built)
        results: dict[Engine, WorkerResult] = {}
        for engine in ENGINES:
            if progress is not None:
                progress(engine, 0, 1)
            results[engine] = run_worker(
                engine,
                models_dir,
                threads,
                requests,
                seed=seed,
                timeout=worker_timeout,
                idle_window_s=idle_window_s,
            )
            if progress is not None:
                progress(engine, 1, 1)
        return DemoResult(count, threads, requests, results["corral"], results["onnxruntime"])

    if folder is None:
        with tempfile.TemporaryDirectory(prefix="corral-demo-") as scratch:
            return measure(Path(scratch))
    kept = Path(folder)
    if kept.is_dir() and any(kept.glob("*.onnx")):
        raise ValueError(f"{kept} already holds .onnx files; give an empty or new folder")
    return measure(kept)


def run_worker(
    engine: Engine,
    models_dir: str | Path,
    threads: int,
    requests: int,
    *,
    seed: int = 0,
    timeout: float = 900.0,
    idle_window_s: float = IDLE_WINDOW_S,
) -> WorkerResult:
    """Run :func:`measure_engine` in a fresh interpreter and return what it measured.

    Raises :class:`WorkerFailed`, with the worker's stderr, if it exits with an error, prints
    no result, or runs longer than ``timeout`` seconds (it is then killed).
    """
    arguments = [
        f"--engine={engine}",
        f"--models={models_dir}",
        f"--threads={threads}",
        f"--requests={requests}",
        f"--seed={seed}",
        f"--idle-window-s={idle_window_s}",
    ]
    return run_worker_process(
        ["-m", "corral.demo", "worker", *arguments],
        f"the {engine} worker",
        WorkerResult.from_json,
        timeout,
    )


def run_worker_process(
    arguments: Sequence[str],
    label: str,
    parse: Callable[[str], Parsed],
    timeout: float,
) -> Parsed:
    """Run ``python *arguments`` in a fresh interpreter and parse the result it prints.

    ``arguments`` start with ``-m module`` or a script's path. The result is the last line
    the worker prints (onnxruntime may print to stdout itself); ``label`` names the worker in
    messages. Raises :class:`WorkerFailed`, with the worker's stderr, if it exits with an
    error, prints no result ``parse`` accepts, or runs longer than ``timeout`` seconds (it
    is then killed).

    Example::

        result = run_worker_process(["-m", "corral.demo", "worker", ...], "the worker",
                                    WorkerResult.from_json, timeout=600)
    """
    command = [sys.executable, *arguments]
    try:
        completed = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise WorkerFailed(
            f"{label} did not finish within {timeout:g}s and was killed; "
            f"stderr:\n{_text(exc.stderr)}"
        ) from exc
    if completed.returncode != 0:
        raise WorkerFailed(
            f"{label} exited with status {completed.returncode}; stderr:\n{completed.stderr}"
        )
    lines = completed.stdout.strip().splitlines()
    try:
        return parse(lines[-1])
    except (IndexError, ValueError, TypeError) as exc:
        raise WorkerFailed(
            f"{label} printed no result (stdout: {completed.stdout!r}); stderr:\n{completed.stderr}"
        ) from exc


def measure_engine(
    engine: Engine,
    models_dir: str | Path,
    threads: int,
    requests: int,
    *,
    seed: int = 0,
    idle_window_s: float = IDLE_WINDOW_S,
) -> WorkerResult:
    """Load every model in ``models_dir`` with ``engine`` and serve a batch-1 workload.

    Meant for a fresh process (see :func:`run_worker`): it measures the whole process, and
    for ``corral`` it shuts the process Runtime down at the end. Models are loaded from
    ``threads`` threads; then ``threads`` threads share ``requests`` runs, each on a model
    picked uniformly at random (seeded by ``seed`` and the thread's index); then the process
    idles for ``idle_window_s`` seconds, its CPU time measured.
    """
    try:
        import psutil
    except ImportError as exc:
        raise ImportError(
            f"the demo needs psutil (the demo extra): {install_hint('demo')}"
        ) from exc
    # Imported before the first measurement so that both engines start from the same point:
    # corral imports this same module when its first session loads.
    importlib.import_module("onnxruntime")

    if threads < 1 or requests < 1:
        raise ValueError(f"threads and requests must be at least 1, got {threads}, {requests}")
    paths = sorted(Path(models_dir).glob("*.onnx"))
    if not paths:
        raise ValueError(f"no .onnx files in {models_dir}")
    process = psutil.Process()
    load, run, finish = _engine(engine)

    threads_before = process.num_threads()
    rss_before = process.memory_info().rss
    # Guards loader_ids: the OS ids of the threads that loaded models.
    loader_ids_lock = threading.Lock()
    loader_ids: set[int] = set()

    def load_noting_thread(path: Path) -> Any:
        with loader_ids_lock:
            loader_ids.add(threading.get_native_id())
        return load(path)

    started = time.perf_counter()
    with ThreadPoolExecutor(threads, thread_name_prefix="demo-load") as pool:
        sessions = list(pool.map(load_noting_thread, paths))
    load_seconds = time.perf_counter() - started
    threads_after_load = _threads_besides(process, loader_ids)
    rss_after_load = process.memory_info().rss

    run_seconds, server_ids = _serve(sessions, run, threads, requests, seed)
    threads_after_run = _threads_besides(process, server_ids)
    # Blocks for the window and compares the process's CPU time before and after it.
    idle_cpu_percent = process.cpu_percent(interval=idle_window_s)

    started = time.perf_counter()
    sessions.clear()
    finish()
    close_seconds = time.perf_counter() - started
    return WorkerResult(
        engine=engine,
        sessions=len(paths),
        threads=threads,
        threads_before=threads_before,
        threads_after_load=threads_after_load,
        rss_before=rss_before,
        rss_after_load=rss_after_load,
        rss_per_session=(rss_after_load - rss_before) / len(paths),
        load_seconds=load_seconds,
        requests=requests,
        run_seconds=run_seconds,
        throughput=requests / run_seconds,
        idle_cpu_percent=idle_cpu_percent,
        threads_after_run=threads_after_run,
        close_seconds=close_seconds,
    )


def _engine(
    engine: str,
) -> tuple[Callable[[Path], Any], Callable[[Any, Any], object], Callable[[], None]]:
    """How ``engine`` loads a model, runs it, and ends."""
    if engine == "corral":
        import corral

        def finish_corral() -> None:
            corral.runtime().shutdown()

        return corral.Session, _run_corral, finish_corral
    if engine == "onnxruntime":
        return _load_onnxruntime, _run_onnxruntime, _finish_onnxruntime
    raise ValueError(f"unknown engine {engine!r}: expected one of {', '.join(ENGINES)}")


def _run_corral(session: Any, feed: Any) -> object:
    return session.run(feed)


def _load_onnxruntime(path: Path) -> Any:
    import onnxruntime

    # onnxruntime's defaults on purpose: they are what the demo compares against.
    return onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _run_onnxruntime(session: Any, feed: Any) -> object:
    return session.run(None, feed)


def _finish_onnxruntime() -> None:
    # Each InferenceSession owns its pools and frees them with the session.
    pass


def _serve(
    sessions: Sequence[Any],
    run: Callable[[Any, Any], object],
    threads: int,
    requests: int,
    seed: int,
) -> tuple[float, set[int]]:
    """Share ``requests`` runs among ``threads`` threads.

    Returns the wall time they took and the OS ids of the threads.
    """
    # The remainder goes to the first threads so that exactly `requests` runs happen.
    shares = [requests // threads + (index < requests % threads) for index in range(threads)]
    # The main thread is a party too: it starts the clock once every worker is ready.
    start_line = threading.Barrier(threads + 1)
    # Guards failures: the first exception of each workload thread.
    failures_lock = threading.Lock()
    failures: list[BaseException] = []

    def serve(index: int) -> None:
        try:
            rng = np.random.default_rng(seed + index)
            picks = rng.integers(len(sessions), size=shares[index])
            feed = {"X": rng.standard_normal((1, N_FEATURES), dtype=np.float32)}
            start_line.wait()
            for pick in picks:
                run(sessions[pick], feed)
        except threading.BrokenBarrierError:
            return
        except Exception as exc:
            with failures_lock:
                failures.append(exc)
            # Before the start this frees the other parties; after it, it changes nothing.
            start_line.abort()

    workers = [
        threading.Thread(target=serve, args=(index,), name=f"demo-serve-{index}")
        for index in range(threads)
    ]
    started = time.perf_counter()
    try:
        for worker in workers:
            worker.start()
        start_line.wait()
        started = time.perf_counter()
    except threading.BrokenBarrierError:
        pass  # a workload thread failed before the start; its error is in failures
    except BaseException:
        start_line.abort()
        raise
    finally:
        for worker in workers:
            if worker.ident is not None:
                worker.join()
    elapsed = time.perf_counter() - started
    if failures:
        raise failures[0]
    return elapsed, {worker.native_id for worker in workers if worker.native_id is not None}


def _threads_besides(process: Any, finished: set[int]) -> int:
    """The process's OS threads, not counting ``finished`` ones.

    A joined thread can still be listed by the OS for a moment while it exits, so the
    count leaves out the benchmark's own threads by id rather than trusting it to be gone.
    """
    return sum(1 for thread in process.threads() if thread.id not in finished)


def _text(output: str | bytes | None) -> str:
    if output is None:
        return ""
    return output if isinstance(output, str) else output.decode(errors="replace")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def _main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m corral.demo",
        description="A demo worker: measure one engine and print one JSON line.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    worker = commands.add_parser("worker", help="load a folder of models and serve a workload")
    worker.add_argument("--engine", choices=ENGINES, required=True)
    worker.add_argument("--models", type=Path, required=True, help="folder of .onnx files")
    worker.add_argument("--threads", type=_positive_int, required=True)
    worker.add_argument("--requests", type=_positive_int, required=True)
    worker.add_argument("--seed", type=int, default=0)
    worker.add_argument("--idle-window-s", type=float, default=IDLE_WINDOW_S)
    args = parser.parse_args(argv)
    result = measure_engine(
        args.engine,
        args.models,
        args.threads,
        args.requests,
        seed=args.seed,
        idle_window_s=args.idle_window_s,
    )
    print(json.dumps(asdict(result)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_main())
