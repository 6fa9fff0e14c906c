"""corral serve keeps long-lived objects out of the cyclic GC's collections (gc.freeze).

A full collection walks every object the collector tracks while holding the GIL: every
request in the process waits for it. ``freeze_long_lived`` collects first, then freezes; these
tests hold it to that order, and hold the claim that makes freezing loaded models safe:
unloading one frees it by reference counting, with no cycle left for a collector that will
never look at it again.
"""

from __future__ import annotations

import gc
import logging
import weakref
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from corral import Host
from corral.server.app import freeze_long_lived
from corral.testing import build_tree
from tests.helpers import add_model


@pytest.fixture(autouse=True)
def unfrozen() -> Iterator[None]:
    """Whatever a test freezes is given back to the collector after it."""
    gc.unfreeze()
    try:
        yield
    finally:
        gc.unfreeze()


class Node:
    """A container the collector tracks."""

    def __init__(self) -> None:
        self.other: Node | None = None


def test_garbage_is_collected_before_the_rest_is_frozen(caplog: pytest.LogCaptureFixture):
    cycle = Node()
    cycle.other = Node()
    cycle.other.other = cycle  # unreachable once dropped: only the collector can free it
    gone = weakref.ref(cycle)
    del cycle
    kept = Node()
    gc.disable()  # no collection of its own between the del and the freeze
    try:
        with caplog.at_level(logging.INFO, logger="corral.server.app"):
            frozen = freeze_long_lived("a test")
    finally:
        gc.enable()
    assert gone() is None  # collected, not frozen
    assert frozen > 0
    assert all(o is not kept for o in gc.get_objects())  # frozen: out of every generation
    [record] = [r for r in caplog.records if "kept out of the cyclic GC" in r.message]
    assert record.message.startswith(f"corral: a test: {frozen} objects kept out")


MODELS = 12


def test_frozen_models_are_freed_without_the_collector_when_unloaded(tmp_path: Path):
    names = [f"tree{seed}" for seed in range(MODELS)]
    for seed, name in enumerate(names):
        add_model(tmp_path, name, build_tree(seed=seed))
    with Host(tmp_path) as host:
        for name in names:
            host.infer(name, {"X": np.zeros((1, 4), np.float32)})
        freeze_long_lived("a test")
        loaded = gc.get_freeze_count()
        gc.disable()
        try:
            for name in names:
                host.unload(name)
            freed = loaded - gc.get_freeze_count()
            # Anything of theirs in a cycle would now be unreachable: find it by collecting
            # with the freeze undone, keeping what the collector finds.
            gc.unfreeze()
            gc.set_debug(gc.DEBUG_SAVEALL)
            gc.collect()
            cyclic = [
                type(o).__module__ + "." + type(o).__qualname__
                for o in gc.garbage
                if type(o).__module__.split(".")[0] in {"corral", "onnxruntime", "numpy"}
            ]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
    # Each version's session, queue and counters, by reference counting (a load worker may
    # still hold its last load's version in an idle frame, freed at its next load).
    assert freed > (MODELS - 2) * 10
    assert cyclic == []
