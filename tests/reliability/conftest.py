"""The reliability suite's ``figure`` fixture: each test records what it measured.

``figure("what", value)`` records one figure under the test's id; ``tests/figures.py``
prints them all at the end of the run (``make test`` shows them).
"""

from __future__ import annotations

import pytest

from tests.figures import record
from tests.helpers import Figure


@pytest.fixture
def figure(request: pytest.FixtureRequest) -> Figure:
    """Record one figure of this test: ``figure("answers / requests", "3000 / 3000")``."""

    def recorded(what: str, value: object) -> None:
        record(request.node, what, value)

    return recorded
