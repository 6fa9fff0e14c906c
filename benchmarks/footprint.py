"""Threads, RSS and load time of many loaded models: corral's Host against onnxruntime.

For each model count (100, 1,000 and 10,000 by default), three engines load the first
``count`` models of one Triton-layout repository, each in a fresh interpreter, and report
the process's OS threads, its resident memory (RSS) and the wall time to load them all:

- ``corral-host``: a :class:`corral.Host` preloading the models (every session on
  onnxruntime's global pools, each model warmed up by one run as it loads);
- ``onnxruntime-default``: one ``onnxruntime.InferenceSession`` per model with default
  options, so each session owns its own thread pools;
- ``onnxruntime-global``: the same sessions on onnxruntime's global pools (one thread each),
  which is the setting corral builds on, without corral.

Every engine gets its own process because threads and RSS are process-wide, and because
once the global pools are set, sessions with default options fail in that process.

From a checkout (``make bench-footprint``)::

    python benchmarks/footprint.py [--counts 100,1000,10000] [--json [FILE]]

Progress goes to stderr and the table to stdout: with progress bars and a rich table when
rich is installed, as plain lines and a plain table otherwise. ``--json`` prints the raw
results instead of the table; ``--json FILE`` writes them to FILE besides the table.

Two more commands: one worker (it prints one JSON line), and the repository the benchmark
loads, which ``make serve`` serves::

    python benchmarks/footprint.py worker --engine corral-host --repo DIR --count 1000
    python benchmarks/footprint.py repository DIR --count 1000

From Python::

    for row in measure_footprint(counts=(100, 1000)):
        print(row["count"], row["engine"], row["threads_after"], row["rss_per_model"])
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypedDict, get_args

import numpy as np

import corral
from corral.demo import N_FEATURES, demo_model, run_worker_process

# Run as a script (`python benchmarks/footprint.py`): its helpers import as benchmarks.console.
_SCRIPT = Path(__file__).resolve()
_ROOT = str(_SCRIPT.parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from benchmarks.console import has_rich  # noqa: E402
from corral.cli.commands import positive_int  # noqa: E402
from corral.cli.progress import progress_bar  # noqa: E402

if TYPE_CHECKING:
    from rich.progress import TaskID
    from rich.table import Table

__all__ = [
    "DEFAULT_COUNTS",
    "ENGINES",
    "TABLE_HEADERS",
    "FootprintEngine",
    "FootprintProgress",
    "FootprintResult",
    "FootprintStep",
    "build_repository",
    "footprint_table",
    "format_table",
    "main",
    "measure_footprint",
    "parse_counts",
    "run_footprint_worker",
    "summary_rows",
]

#: ``corral-host``: a corral Host; ``onnxruntime-default``: InferenceSessions with default
#: options; ``onnxruntime-global``: InferenceSessions on onnxruntime's global pools.
FootprintEngine = Literal["corral-host", "onnxruntime-default", "onnxruntime-global"]
ENGINES: tuple[FootprintEngine, ...] = get_args(FootprintEngine)

#: The model counts the issue asks for.
DEFAULT_COUNTS: tuple[int, ...] = (100, 1000, 10000)

#: What :func:`measure_footprint` reports progress on: the models it writes, then each worker.
FootprintStep = Literal["build", FootprintEngine]
#: ``progress(step, done, total)``. ``build`` counts models written out of the largest count;
#: an engine's step reports ``0`` of ``count`` when its worker starts loading ``count``
#: models and ``count`` of ``count`` when the worker has finished.
FootprintProgress = Callable[[FootprintStep, int, int], None]

#: Seconds one worker may take before it is killed. Loading 10,000 sessions with default
#: options takes minutes on a small machine: each one starts a thread pool.
WORKER_TIMEOUT_S = 1800.0

_VERSION = "1"
_MODEL_FILE = "model.onnx"
_NEEDS_PSUTIL = (
    "the footprint benchmark needs psutil: pip install -e '.[dev]' in corral's clone (make venv)"
)
_OUTPUT = "Y"


class FootprintResult(TypedDict):
    """What one worker measured, in its own process: one engine holding ``count`` models."""

    engine: str
    #: Models loaded.
    count: int
    #: OS threads of the process before loading (after importing onnxruntime and corral).
    threads_before: int
    #: OS threads once every model is loaded and has run once, the loading threads left out.
    threads_after: int
    #: Resident memory before loading, in bytes.
    rss_before: int
    #: Resident memory once every model is loaded and has run once, in bytes.
    rss_after: int
    #: ``(rss_after - rss_before) / count``, in bytes.
    rss_per_model: float
    #: Wall time to load every model.
    load_seconds: float
    #: Models whose one run after loading returned an output of the expected shape.
    ok_runs: int


def build_repository(
    root: str | Path, count: int, progress: Callable[[int], None] | None = None
) -> list[Path]:
    """Write ``count`` tiny models (tree, linear, MLP in turn) as ``root/m00001/1/model.onnx`` ...

    The same models as ``corral demo`` builds (:func:`corral.demo.demo_model`), laid out as
    Triton lays out a model repository, so that :class:`corral.Host` serves them as
    ``m00001`` ... Every model takes ``X`` float32 ``[N, 4]``. ``progress(n)`` is called
    after each model with the number written so far. Returns the model files in name order.

    Example::

        build_repository("models/", 1000)
    """
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    root = Path(root)
    # Wide enough that the names sort in the order they were built.
    width = max(5, len(str(count)))
    paths = []
    for index in range(count):
        folder = root / f"m{index + 1:0{width}d}" / _VERSION
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / _MODEL_FILE
        path.write_bytes(demo_model(index))
        paths.append(path)
        if progress is not None:
            progress(index + 1)
    return paths


def parse_counts(text: str) -> tuple[int, ...]:
    """Model counts from ``"100,1000,10000"``: positive, ascending, each once.

    Raises ValueError naming the piece that is not a positive integer.

    >>> parse_counts("1000, 100,1000")
    (100, 1000)
    """
    counts = set()
    for piece in text.split(","):
        try:
            value = int(piece)
        except ValueError:
            raise ValueError(f"model counts must be positive integers, got {piece!r}") from None
        if value < 1:
            raise ValueError(f"model counts must be positive integers, got {value}")
        counts.add(value)
    return tuple(sorted(counts))


def measure_footprint(
    counts: Iterable[int] = DEFAULT_COUNTS,
    progress: FootprintProgress | None = None,
    *,
    timeout: float = WORKER_TIMEOUT_S,
) -> list[FootprintResult]:
    """Measure every engine holding each count of models, one worker process each.

    Builds one repository of ``max(counts)`` models in a temporary folder (removed
    afterwards) and has every worker load the first ``count`` of them. Counts are measured
    in ascending order, the three engines side by side for each: the results come in that
    order, ``ENGINES`` within each count. Each worker is killed after ``timeout`` seconds.
    Raises :class:`corral.demo.WorkerFailed`, with the worker's stderr, if one fails.
    """
    given = list(counts)
    ordered = sorted(set(given))
    if not ordered or ordered[0] < 1:
        raise ValueError(f"counts must be positive integers, got {given!r}")
    # Fail before building thousands of models rather than in the first worker.
    if importlib.util.find_spec("psutil") is None:
        raise ImportError(_NEEDS_PSUTIL)
    largest = ordered[-1]

    def on_built(done: int) -> None:
        if progress is not None:
            progress("build", done, largest)

    results: list[FootprintResult] = []
    with tempfile.TemporaryDirectory(prefix="corral-footprint-") as scratch:
        build_repository(scratch, largest, on_built)
        for count in ordered:
            for engine in ENGINES:
                if progress is not None:
                    progress(engine, 0, count)
                results.append(run_footprint_worker(engine, scratch, count, timeout=timeout))
                if progress is not None:
                    progress(engine, count, count)
    return results


def run_footprint_worker(
    engine: FootprintEngine, repo: str | Path, count: int, *, timeout: float = WORKER_TIMEOUT_S
) -> FootprintResult:
    """Have a fresh interpreter load the first ``count`` models of ``repo`` with ``engine``.

    Raises :class:`corral.demo.WorkerFailed`, with the worker's stderr, if it exits with an
    error, prints no result, or runs longer than ``timeout`` seconds (it is then killed).
    """
    arguments = [str(_SCRIPT), "worker", f"--engine={engine}", f"--repo={repo}", f"--count={count}"]
    label = f"the {engine} worker ({count} models)"
    return run_worker_process(arguments, label, _parse_result, timeout)


# -- tables ---------------------------------------------------------------------------------

#: Column headings of :func:`summary_rows`: models, what is measured, then one per engine.
TABLE_HEADERS: tuple[str, ...] = ("models", "", *ENGINES)

_METRICS: tuple[tuple[str, Callable[[FootprintResult], float], str], ...] = (
    ("threads", lambda result: result["threads_after"], "{:,.0f}"),
    ("RSS per model (KiB)", lambda result: result["rss_per_model"] / 1024, "{:,.1f}"),
    ("load time (s)", lambda result: result["load_seconds"], "{:,.2f}"),
)


def summary_rows(results: Iterable[FootprintResult]) -> list[list[str]]:
    """The results as table rows under :data:`TABLE_HEADERS`, formatted.

    Three rows per count (threads, RSS per model in KiB, load time in seconds), the count
    shown on the first; one column per engine, ``-`` where an engine was not measured.
    """
    by_count: dict[int, dict[str, FootprintResult]] = {}
    for result in results:
        by_count.setdefault(result["count"], {})[result["engine"]] = result
    rows = []
    for count in sorted(by_count):
        measured = by_count[count]
        for index, (label, value, number) in enumerate(_METRICS):
            cells = [
                number.format(value(measured[engine])) if engine in measured else "-"
                for engine in ENGINES
            ]
            rows.append([f"{count:,}" if index == 0 else "", label, *cells])
    return rows


def format_table(results: Iterable[FootprintResult]) -> str:
    """The results as a plain-text table, for when rich is not installed."""
    rows = [list(TABLE_HEADERS), *summary_rows(results)]
    widths = [max(len(row[column]) for row in rows) for column in range(len(TABLE_HEADERS))]
    lines = []
    for row in rows:
        # The labels read left to right; the figures line up on their last digit.
        cells = [
            cell.ljust(width) if column < 2 else cell.rjust(width)
            for column, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


# -- the worker -----------------------------------------------------------------------------


def _parse_result(line: str) -> FootprintResult:
    data = json.loads(line)
    missing = [name for name in FootprintResult.__annotations__ if name not in data]
    if missing:
        raise ValueError(f"worker result lacks {', '.join(missing)}: {line!r}")
    return FootprintResult(
        engine=str(data["engine"]),
        count=int(data["count"]),
        threads_before=int(data["threads_before"]),
        threads_after=int(data["threads_after"]),
        rss_before=int(data["rss_before"]),
        rss_after=int(data["rss_after"]),
        rss_per_model=float(data["rss_per_model"]),
        load_seconds=float(data["load_seconds"]),
        ok_runs=int(data["ok_runs"]),
    )


def _measure(engine: str, repo: Path, count: int) -> tuple[FootprintResult, object]:
    """Load and run ``count`` models in this process; meant for a fresh one.

    Returns the result and the loaded models, which the caller keeps alive until it exits:
    letting them go here would tear them down before the result is even printed.
    """
    try:
        import psutil
    except ImportError as exc:
        raise ImportError(_NEEDS_PSUTIL) from exc
    # Imported before the first measurement so that every engine starts from the same point.
    importlib.import_module("onnxruntime")

    names = corral.Repository(repo).names()[:count]
    if len(names) < count:
        raise ValueError(f"{repo} holds {len(names)} models, fewer than {count}")
    feed = {"X": np.random.default_rng(0).standard_normal((1, N_FEATURES), dtype=np.float32)}
    process = psutil.Process()
    threads_before = process.num_threads()
    rss_before = process.memory_info().rss
    # Guards loader_ids: the OS ids of the threads that loaded models, which have ended by
    # the time threads are counted again but may still be listed by the OS for a moment.
    loader_ids_lock = threading.Lock()
    loader_ids: set[int] = set()

    def note_loader_thread() -> None:
        with loader_ids_lock:
            loader_ids.add(threading.get_native_id())

    started = time.perf_counter()
    loaded: object
    if engine == "corral-host":
        host, load_seconds = _load_host(repo, names, note_loader_thread, started)
        outputs = [host.infer(name, feed)[_OUTPUT] for name in names]
        loaded = host
    elif engine in ("onnxruntime-default", "onnxruntime-global"):
        sessions, load_seconds = _load_sessions(engine, repo, names, note_loader_thread, started)
        outputs = [session.run(None, feed)[0] for session in sessions]
        loaded = sessions
    else:
        raise ValueError(f"unknown engine {engine!r}: expected one of {', '.join(ENGINES)}")

    # Measured after the runs: the Host warms every model up as it loads it, so counting the
    # sessions before their first run would leave out what that run allocates for them.
    threads_after = _threads_besides(process, loader_ids)
    rss_after = process.memory_info().rss
    result = FootprintResult(
        engine=engine,
        count=count,
        threads_before=threads_before,
        threads_after=threads_after,
        rss_before=rss_before,
        rss_after=rss_after,
        rss_per_model=(rss_after - rss_before) / count,
        load_seconds=load_seconds,
        ok_runs=sum(1 for output in outputs if output.shape == (1, 1)),
    )
    return result, loaded


def _load_host(
    repo: Path, names: Sequence[str], note_loader_thread: Callable[[], None], started: float
) -> tuple[corral.Host, float]:
    host = corral.Host(repo, load_concurrency=_cpu_count())

    def on_loaded(done: int, total: int, name: str, error: object) -> None:
        # Called from the loading thread that loaded ``name`` (or failed to: ``error``).
        note_loader_thread()

    failures = host.preload(names, progress=on_loaded)
    load_seconds = time.perf_counter() - started
    if failures:
        name, error = next(iter(failures.items()))
        error.add_note(f"{len(failures)} of {len(names)} models failed to load, {name} first")
        raise error
    return host, load_seconds


def _load_sessions(
    engine: str,
    repo: Path,
    names: Sequence[str],
    note_loader_thread: Callable[[], None],
    started: float,
) -> tuple[list[Any], float]:
    load = _load_default_session
    if engine == "onnxruntime-global":
        ort = importlib.import_module("onnxruntime")
        # corral's default sizes; once per process, before the first session.
        ort.set_global_thread_pool_sizes(1, 1)

        def load_on_global_pools(path: Path) -> Any:
            options = ort.SessionOptions()
            options.use_per_session_threads = False
            return ort.InferenceSession(
                str(path), sess_options=options, providers=["CPUExecutionProvider"]
            )

        load = load_on_global_pools

    def load_noting_thread(name: str) -> Any:
        note_loader_thread()
        return load(repo / name / _VERSION / _MODEL_FILE)

    with ThreadPoolExecutor(_cpu_count(), thread_name_prefix="footprint-load") as pool:
        sessions = list(pool.map(load_noting_thread, names))
    return sessions, time.perf_counter() - started


def _cpu_count() -> int:
    return os.cpu_count() or 1


def _save_coverage() -> None:
    """Write coverage data if a test suite measures this worker: os._exit skips atexit."""
    try:
        import coverage
    except ImportError:
        return  # not measured: coverage is only installed with the dev extra
    current = coverage.Coverage.current()
    if current is not None:
        current.stop()
        current.save()


def _load_default_session(path: Path) -> Any:
    ort = importlib.import_module("onnxruntime")
    # onnxruntime's defaults on purpose: they are what the benchmark compares against.
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _threads_besides(process: Any, finished: set[int]) -> int:
    """The process's OS threads, not counting ``finished`` ones.

    A joined thread can still be listed by the OS for a moment while it exits, so the
    count leaves out the benchmark's own threads by id rather than trusting it to be gone.
    """
    return sum(1 for thread in process.threads() if thread.id not in finished)


# -- the command line -----------------------------------------------------------------------

#: ``--json`` without a file: the results go to stdout instead of the table.
_STDOUT = Path("-")
# Building 10,000 models takes a few seconds; a line per this many keeps stderr short.
_BUILD_REPORT_EVERY = 1000


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark, or one of its commands, with ``argv`` (default: ``sys.argv[1:]``).

    Returns the exit code; the ``worker`` command never returns (see :func:`_run_worker`).
    """
    args = _parser().parse_args(argv)
    if args.command == "worker":
        _run_worker(args.engine, args.repo, args.count)
    if args.command == "repository":
        build_repository(args.root, args.count)
        print(f"{args.count:,} models written to {args.root}", file=sys.stderr)
        return 0
    results = _measure_with_progress(args.counts)
    if args.json == _STDOUT:
        print(json.dumps(results, indent=2))
        return 0
    _print_table(results)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
        print(f"results written to {args.json}", file=sys.stderr)
    return 0


def footprint_table(results: list[FootprintResult]) -> Table:
    """The results as a rich table, captioned with what each figure means."""
    from rich.table import Table

    fewest = min(result["threads_before"] for result in results)
    most = max(result["threads_before"] for result in results)
    started_with = str(fewest) if fewest == most else f"{fewest} to {most}"
    # A worker fails outright if a run raises; a wrong output only shows here.
    wrong_outputs = "".join(
        f"\n{result['engine']}, {result['count']:,} models: only {result['ok_runs']:,} runs "
        "gave an output of the expected shape."
        for result in results
        if result["ok_runs"] < result["count"]
    )
    table = Table(
        title="Many models in one process: corral's Host against onnxruntime",
        caption=(
            "Threads once every model is loaded and has run once (each worker started with "
            f"{started_with}); RSS added per model; wall time to load them all.\n"
            "onnxruntime-default: a thread pool per session; onnxruntime-global: every "
            f"session on onnxruntime's global pools.{wrong_outputs}"
        ),
    )
    for index, header in enumerate(TABLE_HEADERS):
        # An engine's name on two lines keeps the table within 80 columns, rich's width
        # when stdout is not a terminal.
        table.add_column(header.replace("-", "\n", 1), justify="left" if index < 2 else "right")
    for row in summary_rows(results):
        if row[0] and table.row_count:
            table.add_section()
        table.add_row(*row)
    return table


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="benchmarks/footprint.py",
        # The commands are optional: without one, the script runs the benchmark.
        usage="%(prog)s [-h] [--counts N,N,...] [--json [FILE]] [COMMAND ...]",
        description=(
            "Build one repository of tiny models, then for each count load that many with a "
            "corral Host, with onnxruntime's default sessions and with onnxruntime's global "
            "pools, each in its own process, and compare threads, RSS per model and load time."
        ),
    )
    parser.add_argument(
        "--counts",
        type=_counts,
        default=DEFAULT_COUNTS,
        metavar="N,N,...",
        help="model counts, comma-separated (default 100,1000,10000)",
    )
    parser.add_argument(
        "--json",
        type=Path,
        nargs="?",
        const=_STDOUT,
        metavar="FILE",
        help="print the raw results as JSON instead of the table; with FILE, write them there "
        "besides the table",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    worker = commands.add_parser(
        "worker",
        help="load the first COUNT models of a repository and print one JSON line",
        description="A footprint worker: load models with one engine and print one JSON line.",
    )
    worker.add_argument("--engine", choices=ENGINES, required=True)
    worker.add_argument("--repo", type=Path, required=True, help="a Triton-layout repository")
    worker.add_argument("--count", type=positive_int, required=True)
    repository = commands.add_parser(
        "repository",
        help="write the benchmark's models into a Triton-layout repository (make serve)",
        description="Write COUNT tiny models as ROOT/m00001/1/model.onnx ...",
    )
    repository.add_argument("root", type=Path, help="the repository's root folder")
    repository.add_argument("--count", type=positive_int, default=1000, help="(default 1000)")
    return parser


def _counts(text: str) -> tuple[int, ...]:
    try:
        return parse_counts(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _measure_with_progress(counts: Sequence[int]) -> list[FootprintResult]:
    if not has_rich():
        return measure_footprint(counts, _report_line)
    largest = max(counts)
    with progress_bar() as progress:
        build = progress.add_task(f"building {largest:,} models", total=largest)
        workers: dict[tuple[str, int], TaskID] = {}

        def on_progress(step: FootprintStep, done: int, total: int) -> None:
            if step == "build":
                progress.update(build, completed=done, total=total)
            elif (step, total) not in workers:
                # No total: the bar pulses, as the worker reports nothing until it ends.
                workers[step, total] = progress.add_task(
                    f"{step}: loading {total:,} models in a worker process", total=None
                )
            else:
                progress.update(workers[step, total], completed=done, total=total)

        return measure_footprint(counts, on_progress)


def _report_line(step: FootprintStep, done: int, total: int) -> None:
    if step == "build":
        if done % _BUILD_REPORT_EVERY == 0 or done == total:
            print(f"built {done:,} of {total:,} models", file=sys.stderr, flush=True)
    elif done == 0:
        print(f"{step}: loading {total:,} models ...", file=sys.stderr, flush=True)


def _print_table(results: list[FootprintResult]) -> None:
    if not has_rich():
        print(format_table(results))
        return
    from rich.console import Console

    Console().print(footprint_table(results))


def _run_worker(engine: str, repo: Path, count: int) -> None:
    """Measure in this process, print the result, and leave at once (never returns)."""
    try:
        # The loaded models stay referenced until the process ends: see below.
        result, _kept_alive = _measure(engine, repo, count)
        print(json.dumps(result), flush=True)
    except BaseException:
        traceback.print_exc()
        status = 1
    else:
        status = 0
    sys.stderr.flush()
    # Leave without tearing anything down: closing 10,000 onnxruntime sessions with default
    # options takes minutes (each owns a thread pool whose threads spin and must be joined),
    # and the teardown is not what is measured. Nothing here needs cleaning: the results are
    # printed and flushed, and the OS reclaims the rest.
    _save_coverage()
    os._exit(status)


if __name__ == "__main__":
    sys.exit(main())
