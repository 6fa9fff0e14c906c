"""What the ``corral`` commands share: rich's display, and how they say an extra is missing.

rich comes with the ``server`` extra (so that the operator's commands, ``corral status``,
``models`` and ``check --load``, work where the server is installed) and with ``cli`` (for a
machine that only runs them). Progress goes to stderr, so that stdout carries only a command's
results (``--json`` output can be piped). A command whose extra is missing exits with
:data:`MISSING_EXTRA_STATUS`, naming the ``pip install`` that brings it.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import TYPE_CHECKING, NoReturn

from corral._base import install_hint

if TYPE_CHECKING:
    from rich.progress import Progress

__all__ = ["MISSING_EXTRA_STATUS", "exit_missing_extra", "progress_bar", "require_rich"]

#: The exit status of a command run without the extra it needs: 2, as a usage error
#: (argparse's), never 1, which ``corral check`` and ``corral models`` use for the problems
#: they found.
MISSING_EXTRA_STATUS = 2


def exit_missing_extra(message: str) -> NoReturn:
    """Print ``message`` (what is missing, and the ``pip install`` that brings it), exit 2."""
    print(message, file=sys.stderr)
    raise SystemExit(MISSING_EXTRA_STATUS)


def require_rich(command: str) -> None:
    """Exit with the ``pip install`` that brings rich, when it is missing (status 2)."""
    if importlib.util.find_spec("rich") is None:
        exit_missing_extra(
            f"{command} needs rich (which the server and cli extras bring): " + install_hint("cli")
        )


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
