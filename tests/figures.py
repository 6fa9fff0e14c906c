"""The suite's figures: each test records what it measured, the run prints them at its end.

``figure("what", value)`` (the fixture of ``tests/reliability/conftest.py``) records one
figure on the test's item (its ``user_properties``, which pytest-xdist carries from a worker
to the process that reports), and this plugin, loaded by ``tests/conftest.py``, gathers them
from each test's last report. At the end of the run they are printed as one table (``make
test`` shows it), and written as JSON to the file named by ``CORRAL_RELIABILITY_FIGURES``
when that is set: ``docs/reliability.md`` quotes them from such a run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

#: The user property a figure is recorded under: ("corral-figure", (what, value)).
FIGURE = "corral-figure"

# (test id, what, value), in the order reported.
_FIGURES: list[tuple[str, str, str]] = []


def record(item: pytest.Item, what: str, value: object) -> None:
    """Record one figure of ``item``."""
    item.user_properties.append((FIGURE, (what, str(value))))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Gather a test's figures from its teardown report, which carries every one."""
    if report.when != "teardown":
        return
    for name, value in report.user_properties:
        if name == FIGURE:
            what, text = value
            _FIGURES.append((report.nodeid, what, text))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print every recorded figure, and write them out when asked to."""
    if not _FIGURES:
        return
    terminalreporter.section("reliability figures")
    for test_id, what, value in _FIGURES:
        terminalreporter.write_line(f"{test_id.split('::')[-1]}: {what} = {value}")
    target = os.environ.get("CORRAL_RELIABILITY_FIGURES")
    if target:
        rows = [{"test": t, "what": w, "value": v} for t, w, v in _FIGURES]
        Path(target).write_text(json.dumps(rows, indent=2) + "\n")
