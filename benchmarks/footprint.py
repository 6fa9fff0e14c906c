"""Threads, RSS and load time for 100 / 1,000 / 10,000 models, corral against onnxruntime.

A script around :func:`corral.bench.footprint.measure_footprint`, for running the benchmark
from a checkout without the command line's extras::

    python benchmarks/footprint.py [--counts 100,1000,10000] [--json FILE]

Progress goes to stderr, the table to stdout (drawn with rich when it is installed).
``corral bench footprint`` runs the same measurement with progress bars.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from corral.bench.footprint import (
    DEFAULT_COUNTS,
    TABLE_HEADERS,
    FootprintResult,
    FootprintStep,
    format_table,
    measure_footprint,
    parse_counts,
    summary_rows,
)

# Building 10,000 models takes a few seconds; a line per this many keeps stderr short.
_BUILD_REPORT_EVERY = 1000


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark with ``argv`` (default: ``sys.argv[1:]``); returns the exit code."""
    parser = argparse.ArgumentParser(
        prog="benchmarks/footprint.py",
        description=(
            "Load many tiny models with a corral Host, with onnxruntime's default sessions and "
            "with onnxruntime's global pools, each in its own process, and compare threads, "
            "RSS per model and load time."
        ),
    )
    parser.add_argument(
        "--counts",
        type=_counts,
        default=DEFAULT_COUNTS,
        metavar="N,N,...",
        help="model counts, comma-separated (default 100,1000,10000)",
    )
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the results here")
    args = parser.parse_args(argv)

    results = measure_footprint(args.counts, _report)
    _print_table(results)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
        print(f"results written to {args.json}", file=sys.stderr)
    return 0


def _counts(text: str) -> tuple[int, ...]:
    try:
        return parse_counts(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _report(step: FootprintStep, done: int, total: int) -> None:
    if step == "build":
        if done % _BUILD_REPORT_EVERY == 0 or done == total:
            print(f"built {done:,} of {total:,} models", file=sys.stderr, flush=True)
    elif done == 0:
        print(f"{step}: loading {total:,} models ...", file=sys.stderr, flush=True)


def _print_table(results: list[FootprintResult]) -> None:
    if importlib.util.find_spec("rich") is None:
        print(format_table(results))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Many models in one process: corral's Host against onnxruntime")
    for index, header in enumerate(TABLE_HEADERS):
        # An engine's name on two lines keeps the table within 80 columns, rich's width
        # when stdout is not a terminal.
        table.add_column(header.replace("-", "\n", 1), justify="left" if index < 2 else "right")
    for row in summary_rows(results):
        if row[0] and table.row_count:
            table.add_section()
        table.add_row(*row)
    Console().print(table)


if __name__ == "__main__":
    sys.exit(main())
