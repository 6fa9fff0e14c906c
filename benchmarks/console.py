"""What the benchmark scripts share at the command line: argument types, progress, ratios.

Not a benchmark itself. The scripts (``create.py``, ``footprint.py``, ``scenarios.py``)
import it as ``benchmarks.console``; rich, which draws their progress bars and tables, is
imported only when one is drawn.
"""

from __future__ import annotations

import argparse
import importlib.util
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.progress import Progress

__all__ = ["has_rich", "positive_int", "positive_ints", "progress_bar", "ratio", "require_rich"]


def positive_int(text: str) -> int:
    """An argparse type: a positive integer, or an error that says what was given."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def positive_ints(text: str) -> tuple[int, ...]:
    """An argparse type: comma-separated positive integers, ascending and each once.

    >>> positive_ints("8,1,2,8")
    (1, 2, 8)
    """
    return tuple(sorted({positive_int(piece) for piece in text.split(",")}))


def has_rich() -> bool:
    """Whether rich, which draws the progress bars and tables, is installed."""
    return importlib.util.find_spec("rich") is not None


def require_rich(script: str) -> None:
    """Exit with the ``pip install`` that brings rich if it is missing."""
    if not has_rich():
        raise SystemExit(f"{script} needs rich: pip install 'corral[dev]'")


def progress_bar() -> Progress:
    """A rich progress display on stderr, so that stdout carries only the results."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        Progress,
        SpinnerColumn,
        TaskProgressColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    return Progress(
        SpinnerColumn(finished_text="[green]done"),
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
    )


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
