"""What the benchmark scripts share at the command line beside corral's own CLI helpers.

Not a benchmark itself. The scripts (``create.py``, ``footprint.py``, ``scenarios.py``)
import it as ``benchmarks.console``, and the command line's own helpers (``positive_int``,
``progress_bar``, ``ratio``) from ``corral.cli`` where they are defined; rich, which draws
their progress bars and tables, is imported only when one is drawn.
"""

from __future__ import annotations

import importlib.util

from corral.cli.commands import positive_int

__all__ = ["has_rich", "positive_ints", "require_rich"]


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
        raise SystemExit(
            f"{script} needs rich: pip install -e '.[dev]' in corral's clone (make venv)"
        )
