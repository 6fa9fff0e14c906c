"""Helpers for testing code that uses corral.

:func:`emulate_provider` lets a test suite exercise every concurrency policy on the CPU
provider: sessions that ask for the emulated provider run on the CPU provider while the
provider table still decides their policy and construction rules.

Example::

    with corral.testing.emulate_provider("DmlExecutionProvider"):
        sess = corral.Session(model, providers=["DmlExecutionProvider"])
        assert str(sess.policy).startswith("pool:")
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from corral import _providers

__all__ = ["emulate_provider"]


@contextmanager
def emulate_provider(name: str) -> Iterator[None]:
    """Run sessions that ask for provider ``name`` on the CPU provider, inside the block."""
    with _providers.emulate(name):
        yield
