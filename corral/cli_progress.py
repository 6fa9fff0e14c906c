"""The terminal display the ``corral`` commands share: rich, from the ``cli`` extra.

Progress goes to stderr, so that stdout carries only a command's results (``--json`` output
can be piped).
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.progress import Progress

__all__ = ["progress_bar", "require_rich"]


def require_rich() -> None:
    """Exit with the ``pip install`` that brings rich, when it is missing."""
    if importlib.util.find_spec("rich") is None:
        raise SystemExit("corral's command line needs rich: pip install 'corral[cli]'")


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
