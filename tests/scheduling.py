"""The longest test files first: pytest-xdist's ``--dist loadfile`` then ends on short ones.

``make test`` runs the suite on every core, a file to a worker (``--dist loadfile``), handed
out in the order the files are collected (``--no-loadscope-reorder``: pytest-xdist's own order
is by each file's count of tests, which put the one-test files that start a Ray cluster or a
fresh venv last, and a run ended on one of them with the other worker idle: the last CI's
final minute). Handed out first, they overlap the rest. The list is of files, longest
first; ``make test`` prints its 25 slowest tests to keep it current.
"""

from __future__ import annotations

import pytest

# Files whose tests take 30 s or more in all on 2 cores (make test's --durations, CI).
LONGEST_FIRST = (
    "tests/reliability/test_bad_input.py",
    "tests/test_current_clients.py",
    "tests/ray/test_ray_cluster.py",
    "tests/test_install.py",
    "tests/ray/test_ray_serve.py",
    "tests/core/compute/test_exit.py",
    "tests/reliability/test_memory_limit.py",
    "tests/core/host/test_host.py",
    "tests/benchmarks/test_bench_peers.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Move the tests of :data:`LONGEST_FIRST`'s files to the front, in the list's order."""
    root = config.rootpath
    missing = [path for path in LONGEST_FIRST if not (root / path).is_file()]
    if missing:  # renamed or removed: the list would silently stop ordering them
        raise pytest.UsageError(f"tests/scheduling.py names files that are gone: {missing}")

    def rank(item: pytest.Item) -> int:
        path = item.path.relative_to(root).as_posix()
        return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: each file's tests, and every other file, keep their order
