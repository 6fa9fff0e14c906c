"""The reliability suite's figures: each test records what it measured, the run prints them.

``figure("what", value)`` records one figure under the test's id. At the end of the run the
figures are printed as one table (``make test`` shows it), and written as JSON to the file
named by ``CORRAL_RELIABILITY_FIGURES`` when that is set: ``docs/reliability.md`` quotes
them from such a run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.helpers import Figure

# (test id, what, value), in the order recorded.
_FIGURES: list[tuple[str, str, str]] = []


@pytest.fixture
def figure(request: pytest.FixtureRequest) -> Figure:
    """Record one figure of this test: ``figure("answers / requests", "3000 / 3000")``."""

    def record(what: str, value: object) -> None:
        _FIGURES.append((request.node.nodeid, what, str(value)))

    return record


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
