"""Session construction, one thread against a pool: which builds thousands of models faster.

Builds ``n_models`` tiny models in memory, then in each round creates one
:class:`corral.Session` per model twice, from one thread and from a pool of threads, in
alternating order so neither side always runs on a warmer process. Reports the median of
each side and the ratio parallel / serial (below 1: parallel construction is faster).

From a checkout (``make bench-create``)::

    python benchmarks/create.py [--models 500] [--threads 4] [--rounds 3] [--json]

Progress bars go to stderr, the table (or with ``--json`` the raw results) to stdout.
Needs the dev extra (rich). From Python::

    result = measure_construction(n_models=200, threads=4, rounds=3)
    print(result["ratio"])
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypedDict

import corral
from corral.testing import ModelKind, build_model

# Run as a script (`python benchmarks/create.py`): its helpers import as benchmarks.console.
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from benchmarks.console import require_rich  # noqa: E402
from corral.cli.commands import positive_int  # noqa: E402
from corral.cli.progress import progress_bar  # noqa: E402

if TYPE_CHECKING:
    from rich.table import Table

__all__ = [
    "ConstructionResult",
    "CreateProgress",
    "CreateStep",
    "construction_table",
    "main",
    "measure_construction",
]

#: What :func:`measure_construction` reports progress on: models built, then timed phases.
CreateStep = Literal["build", "measure"]
#: ``progress(step, done, total)``. ``build`` counts models built; ``measure`` counts timed
#: phases (two per round: serial and parallel).
CreateProgress = Callable[[CreateStep, int, int], None]

_MODEL_KINDS: tuple[ModelKind, ...] = ("tree", "linear", "mlp")


class ConstructionResult(TypedDict):
    """What :func:`measure_construction` measured."""

    #: Sessions created per phase.
    models: int
    #: Threads in the parallel phase's pool.
    threads: int
    rounds: int
    #: Seconds to create every session from one thread, one entry per round.
    serial_seconds: list[float]
    #: Seconds to create every session from the pool, one entry per round.
    parallel_seconds: list[float]
    serial_median: float
    parallel_median: float
    #: ``parallel_median / serial_median``: below 1, the pool was faster.
    ratio: float
    #: The concurrency policy the sessions got (``auto`` resolved).
    policy: str
    python: str
    #: False on a free-threaded interpreter running without the GIL.
    gil_enabled: bool


def measure_construction(
    n_models: int = 500,
    threads: int = 4,
    rounds: int = 3,
    progress: CreateProgress | None = None,
) -> ConstructionResult:
    """Time creating ``n_models`` Sessions serially and from ``threads`` threads.

    Uses the process Runtime (:func:`corral.runtime`), starting it if needed and leaving it
    running; every session made here is closed before returning.
    """
    for name, value in (("n_models", n_models), ("threads", threads), ("rounds", rounds)):
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
    models = []
    for index in range(n_models):
        models.append(build_model(_MODEL_KINDS[index % len(_MODEL_KINDS)], seed=index))
        if progress is not None:
            progress("build", index + 1, n_models)

    # The first session sets onnxruntime's global pools; that one-off cost belongs to
    # neither side.
    with corral.Session(models[0]) as first:
        policy = str(first.policy)

    serial: list[float] = []
    parallel: list[float] = []
    phases = 0
    for round_index in range(rounds):
        order = ("serial", "parallel") if round_index % 2 == 0 else ("parallel", "serial")
        for side in order:
            if side == "serial":
                serial.append(_create_serially(models))
            else:
                parallel.append(_create_in_parallel(models, threads))
            phases += 1
            if progress is not None:
                progress("measure", phases, 2 * rounds)

    serial_median = statistics.median(serial)
    parallel_median = statistics.median(parallel)
    is_gil_enabled = getattr(sys, "_is_gil_enabled", None)
    return ConstructionResult(
        models=n_models,
        threads=threads,
        rounds=rounds,
        serial_seconds=serial,
        parallel_seconds=parallel,
        serial_median=serial_median,
        parallel_median=parallel_median,
        ratio=parallel_median / serial_median,
        policy=policy,
        python=sys.version.split()[0],
        gil_enabled=True if is_gil_enabled is None else bool(is_gil_enabled()),
    )


def _create_serially(models: Sequence[bytes]) -> float:
    sessions: list[corral.Session] = []
    try:
        started = time.perf_counter()
        for model in models:
            sessions.append(corral.Session(model))
        return time.perf_counter() - started
    finally:
        _close_all(sessions)


def _create_in_parallel(models: Sequence[bytes], threads: int) -> float:
    # Starting the pool's threads is part of what parallel construction costs.
    started = time.perf_counter()
    with ThreadPoolExecutor(threads, thread_name_prefix="bench-create") as pool:
        futures = [pool.submit(corral.Session, model) for model in models]
    elapsed = time.perf_counter() - started
    # Every future is done once the pool has shut down; close what was built even if some
    # construction failed, then report the first failure.
    _close_all([future.result() for future in futures if future.exception() is None])
    for future in futures:
        error = future.exception()
        if error is not None:
            raise error
    return elapsed


def _close_all(sessions: Sequence[corral.Session]) -> None:
    for session in sessions:
        session.close()


# -- the command line -----------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark with ``argv`` (default: ``sys.argv[1:]``); returns the exit code."""
    parser = argparse.ArgumentParser(
        prog="benchmarks/create.py",
        description=(
            "Create one corral Session per model from one thread and from a pool of threads, "
            "in alternating order for several rounds, and compare the medians."
        ),
    )
    parser.add_argument("--models", type=positive_int, default=500, help="models (default 500)")
    parser.add_argument(
        "--threads", type=positive_int, default=4, help="threads of the pool (default 4)"
    )
    parser.add_argument("--rounds", type=positive_int, default=3, help="rounds (default 3)")
    parser.add_argument("--json", action="store_true", help="print the raw results as JSON")
    args = parser.parse_args(argv)
    require_rich("benchmarks/create.py")
    from rich.console import Console

    with progress_bar() as progress:
        build = progress.add_task(f"building {args.models} models", total=args.models)
        measure = progress.add_task(
            f"creating sessions: {args.rounds} round(s) of serial and parallel",
            total=2 * args.rounds,
        )

        def on_progress(step: CreateStep, done: int, total: int) -> None:
            progress.update(build if step == "build" else measure, completed=done, total=total)

        result = measure_construction(args.models, args.threads, args.rounds, on_progress)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        Console().print(construction_table(result))
    return 0


def construction_table(result: ConstructionResult) -> Table:
    """The result as a rich table: each side's median, sessions/s and every round."""
    from rich.table import Table

    table = Table(
        title=f"Creating {result['models']:,} sessions, {result['rounds']} round(s)",
        caption=(
            f"parallel / serial: {result['ratio']:.2f}x (below 1: the pool is faster). "
            f"Policy {result['policy']}, Python {result['python']}, "
            f"GIL {'on' if result['gil_enabled'] else 'off'}."
        ),
    )
    table.add_column("")
    table.add_column("median (s)", justify="right")
    table.add_column("sessions/s", justify="right")
    table.add_column("each round (s)", justify="right")
    sides: Sequence[tuple[str, float, list[float]]] = (
        ("serial (1 thread)", result["serial_median"], result["serial_seconds"]),
        (
            f"parallel ({result['threads']} threads)",
            result["parallel_median"],
            result["parallel_seconds"],
        ),
    )
    for label, median, rounds in sides:
        table.add_row(
            label,
            f"{median:.3f}",
            f"{result['models'] / median:,.0f}",
            "  ".join(f"{seconds:.3f}" for seconds in rounds),
        )
    return table


if __name__ == "__main__":
    sys.exit(main())
