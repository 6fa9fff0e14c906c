"""Fixtures of the Host's own pieces, shared by their tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from corral import HostOptions
from corral._host.table import ModelTable


@pytest.fixture
def make_table() -> Iterator[Callable[..., ModelTable]]:
    """Tables with the given HostOptions fields, closed as a Host closes them at the end."""
    tables: list[ModelTable] = []

    def make(**options: Any) -> ModelTable:
        table = ModelTable(HostOptions(**options))
        tables.append(table)
        return table

    yield make
    for table in tables:
        table.begin_close()
        table.drain(table.retire_all(), timeout=10)
        table.finish_close()
