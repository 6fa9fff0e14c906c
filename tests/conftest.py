"""Shared fixtures: tiny models built in code, the common repository, a leaked-thread check.

onnxruntime's global pools are set once per process, so every test in this process uses the
default Runtime options; tests of other options run in subprocesses. The helpers tests call
are in tests/helpers.py: this file holds fixtures only.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import corral
from corral.testing import build_linear, build_mlp, build_tree
from tests.gates import BuildGate
from tests.helpers import Pieces, add_model, build_slow_loop

# The figures tests record, printed at the end of the run (also under pytest-xdist); the
# longest test files handed out first.
pytest_plugins = ["tests.figures", "tests.scheduling"]


@pytest.fixture(autouse=True)
def fresh_runtime(no_leaked_threads: None) -> Iterator[None]:
    """Each test starts with a usable process Runtime and leaves no session behind.

    Depends on ``no_leaked_threads`` so that it is torn down first: shutting the Runtime
    down stops its compute workers, which belong to the process, not to any one test.
    """
    yield
    rt = corral.runtime()
    rt.shutdown(timeout=10, cancel=True)


@pytest.fixture(autouse=True)
def no_leaked_threads() -> Iterator[None]:
    """Fail any test that leaves a Python thread running."""
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + 5.0
    leaked = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    for thread in leaked:
        thread.join(max(0.0, deadline - time.monotonic()))
    still = [t.name for t in leaked if t.is_alive()]
    assert not still, f"test leaked threads: {still}"


@pytest.fixture(scope="session")
def tree_model() -> bytes:
    return build_tree(n_features=4, depth=3, seed=1)


@pytest.fixture(scope="session")
def linear_model() -> bytes:
    return build_linear(n_features=4, seed=2)


@pytest.fixture(scope="session")
def mlp_model() -> bytes:
    return build_mlp(n_features=4, seed=3)


@pytest.fixture(params=["tree", "linear", "mlp"])
def any_model(request: pytest.FixtureRequest) -> bytes:
    model: bytes = request.getfixturevalue(f"{request.param}_model")
    return model


@pytest.fixture
def model_path(tmp_path: Path, mlp_model: bytes) -> Path:
    path = tmp_path / "model.onnx"
    path.write_bytes(mlp_model)
    return path


@pytest.fixture(scope="session")
def slow_model() -> bytes:
    return build_slow_loop()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """The common repository, at ``tmp_path``: "mlp" (seed 1) and "tree" (seed 2), version 1."""
    add_model(tmp_path, "mlp", build_mlp(seed=1))
    add_model(tmp_path, "tree", build_tree(seed=2))
    return tmp_path


@pytest.fixture
def make_pieces(repo: Path) -> Iterator[Callable[..., Pieces]]:
    """A Host's pieces over the common repository (two load workers unless told), closed after."""
    made: list[Pieces] = []

    def make(**options: Any) -> Pieces:
        made.append(Pieces.over(repo, **{"load_concurrency": 2, **options}))
        return made[-1]

    yield make
    for pieces in made:
        pieces.close()


@pytest.fixture
def builds(
    monkeypatch: pytest.MonkeyPatch, make_pieces: Callable[..., Pieces]
) -> Iterator[BuildGate]:
    """A :class:`BuildGate` on every session built; opened before the pieces close."""
    gate = BuildGate(monkeypatch)
    yield gate
    gate.opened.set()


@pytest.fixture
def garbage_collected_on_the_main_thread() -> Iterator[None]:
    """Collect a test's garbage on the main thread when it ends.

    For tests that use tritonclient's HTTP client, which is gevent-based: its ``__del__`` must
    run on the thread that made it. One kept alive by a reference cycle (a caught exception's
    traceback holds the test's frame) would otherwise be collected on whichever thread a later
    garbage collection runs on, and fail there with gevent's InvalidThreadUseError.
    """
    yield
    gc.collect()


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """What ``corral serve`` would serve with: its ServerSettings, captured instead of served.

    The command line runs as written, but ``run`` (and ``--processes``'s ``run_group``)
    records the settings and returns 0; no ``CORRAL_*`` variable of this process is seen.
    """
    import corral.server.app
    import corral.server.processes
    from corral.server.settings import ServerSettings

    captured: list[Any] = []

    def run(settings: Any) -> int:
        captured.append(settings)
        return 0

    monkeypatch.setattr(corral.server.app, "run", run)
    monkeypatch.setattr(corral.server.processes, "run_group", run)
    for name in ServerSettings.model_fields:
        monkeypatch.delenv("CORRAL_" + name.upper(), raising=False)
    return captured
