"""``corral demo``: corral against onnxruntime's defaults on many small models, drawn.

The demo itself lives in :mod:`corral.demo` and reports progress through plain callbacks;
this command draws it (a bar while building, a line per worker) and prints the comparison as
a table, or as JSON with ``--json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from corral.cli.progress import progress_bar, require_rich

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID
    from rich.table import Table

    from corral.demo import DemoResult, DemoStep

__all__ = ["ratio", "run_demo"]


def run_demo(args: argparse.Namespace) -> int:
    """``corral demo``: build the models, run both workers, print the comparison."""
    require_rich("corral demo")
    from rich.console import Console

    from corral.demo import IDLE_WINDOW_S, WorkerFailed
    from corral.demo import run_demo as build_and_compare

    # corral.demo's ImportErrors (a missing extra) already say what to install.
    try:
        with progress_bar() as progress:
            display = _DemoDisplay(progress, args.models)
            result = build_and_compare(
                args.models,
                args.threads,
                args.requests,
                folder=args.keep,
                progress=display,
                idle_window_s=args.idle_window_s or IDLE_WINDOW_S,
            )
    except ImportError as exc:
        raise SystemExit(str(exc)) from exc
    except WorkerFailed as exc:
        # Not a CorralError: the demo's own measuring process broke, not a request to corral.
        print(f"corral demo: error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        Console().print(_demo_table(result))
    if args.keep is not None:
        print(f"models kept in {args.keep}", file=sys.stderr)
    return 0


class _DemoDisplay:
    """Draws run_demo's progress: a bar while building, then a line per worker."""

    def __init__(self, progress: Progress, count: int) -> None:
        self._progress = progress
        self._build = progress.add_task(f"building {count} models", total=count)
        self._workers: dict[str, TaskID] = {}

    def __call__(self, step: DemoStep, done: int, total: int) -> None:
        if step == "build":
            self._progress.update(self._build, completed=done)
        elif step not in self._workers:
            # No total: the bar pulses, as the worker reports nothing until it ends.
            self._workers[step] = self._progress.add_task(
                f"{step}: loading and serving in a worker process", total=None
            )
        else:
            self._progress.update(self._workers[step], total=total, completed=done)


def _demo_table(result: DemoResult) -> Table:
    from rich.table import Table

    ours, theirs = result.corral, result.onnxruntime
    table = Table(
        title=(
            f"{result.models:,} models, {result.threads} threads, "
            f"{result.requests:,} batch-1 requests"
        ),
        caption=(
            "corral: every session on onnxruntime's global pools; onnxruntime defaults: "
            f"a thread pool per session. Threads before loading: {ours.threads_before} "
            f"and {theirs.threads_before}.\nonnxruntime's per-session pools spin, which keeps "
            "the cores awake for the Python threads' hand-offs: that buys throughput with many "
            "caller threads, and burns the idle CPU shown in the table."
        ),
    )
    table.add_column("")
    table.add_column("corral", justify="right")
    table.add_column("onnxruntime defaults", justify="right")
    table.add_column("corral / onnxruntime", justify="right")
    rows: list[tuple[str, float, float, str]] = [
        ("threads (after load)", ours.threads_after_load, theirs.threads_after_load, "{:,.0f}"),
        (
            "RSS per session (KiB)",
            ours.rss_per_session / 1024,
            theirs.rss_per_session / 1024,
            "{:,.1f}",
        ),
        ("load time (s)", ours.load_seconds, theirs.load_seconds, "{:,.2f}"),
        ("throughput (runs/s)", ours.throughput, theirs.throughput, "{:,.0f}"),
        ("idle CPU (%)", ours.idle_cpu_percent, theirs.idle_cpu_percent, "{:,.1f}"),
    ]
    for label, corral_value, onnxruntime_value, number in rows:
        table.add_row(
            label,
            number.format(corral_value),
            number.format(onnxruntime_value),
            ratio(corral_value, onnxruntime_value),
        )
    return table


def ratio(numerator: float, denominator: float) -> str:
    """``numerator / denominator`` as ``1.23x``; ``-`` when the denominator is 0.

    >>> ratio(3, 1003)
    '0.003x'
    """
    if denominator == 0:
        return "-"
    value = numerator / denominator
    if value >= 10:
        return f"{value:,.0f}x"
    if value == 0 or value >= 0.1:
        return f"{value:.2f}x"
    # Two significant digits, so that 3 threads against 1,003 does not read as 0.00x.
    return f"{value:.2g}x"
