"""Triton's ``perf_analyzer``, kept in a venv of its own where it runs, never in corral's.

Where the binary comes from, in this order:

1. ``$CORRAL_PERF_ANALYZER``: a ``perf_analyzer`` the user has (NVIDIA's SDK container, a
   build of their own), used as it is.
2. PyPI's standalone ``perf-analyzer`` wheel, where the C library allows it: it ships only
   ``manylinux_2_38`` wheels, which need glibc 2.38 or later.
3. Otherwise the binary of ``tritonclient`` 2.41's wheel (:data:`TRITONCLIENT_PINS`): the last
   releases of the client library that carried a working ``perf_analyzer``; today's ship a
   placeholder in its place. It loads ``libcudart`` even without a GPU (the
   ``nvidia-cuda-runtime-cu12`` wheel carries it) and Debian's libb64 (``make tools``).

The venv lives under ``$CORRAL_BENCH_CACHE/perf-analyzer`` (default
``~/.cache/corral-bench``), made once and kept (a stamp records what it holds); the tests and
the benchmarks share it. corral's own venv keeps whatever tritonclient it likes as a client
library: its ``perf_analyzer``, if any, is never used.

Example::

    python benchmarks/perf_analyzer.py        # makes the venv if needed, prints the binary
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Run as a script (`python benchmarks/perf_analyzer.py`): the peers import as benchmarks.peers.
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

from benchmarks.peers import CACHE, PeerUnavailable, install_venv  # noqa: E402

__all__ = [
    "PINS_BY_GLIBC",
    "TRITONCLIENT_PINS",
    "PerfAnalyzer",
    "PerfAnalyzerUnavailable",
    "glibc_version",
    "perf_analyzer",
    "pins",
]

#: The last tritonclient releases whose wheel holds a working perf_analyzer binary, and the
#: CUDA runtime it loads at start.
TRITONCLIENT_PINS = (
    "tritonclient==2.41.*",
    "nvidia-cuda-runtime-cu12>=12.0",
)
#: PyPI's standalone perf_analyzer, and the glibc its only wheels (manylinux_2_38) need.
PINS_BY_GLIBC = ((2, 38), ("perf-analyzer",))
_START_TIMEOUT_S = 30.0


class PerfAnalyzerUnavailable(Exception):
    """perf_analyzer cannot be installed or started here; the message says why and the fix."""


@dataclass(frozen=True)
class PerfAnalyzer:
    """A perf_analyzer that starts here: the binary, and the environment to run it in."""

    binary: Path
    environment: dict[str, str]
    #: Where it came from, for reports: ``$CORRAL_PERF_ANALYZER`` or the pins installed.
    source: str


def glibc_version() -> tuple[int, int] | None:
    """The glibc of this machine as (major, minor), or None where the C library is not glibc."""
    try:
        found = re.fullmatch(r"glibc (\d+)\.(\d+).*", os.confstr("CS_GNU_LIBC_VERSION") or "")
    except (AttributeError, ValueError, OSError):
        return None
    return None if found is None else (int(found[1]), int(found[2]))


def pins(glibc: tuple[int, int] | None) -> tuple[str, ...]:
    """What the venv installs on a machine of glibc ``glibc``."""
    needed, standalone = PINS_BY_GLIBC
    if glibc is not None and glibc >= needed:
        return standalone
    return TRITONCLIENT_PINS


def perf_analyzer(cache: Path = CACHE) -> PerfAnalyzer:
    """A perf_analyzer that starts here: ``$CORRAL_PERF_ANALYZER``, else its own venv's.

    Makes the venv under ``cache`` the first time (a minute, from the package index), and
    checks that the binary starts (``--version``). Raises :class:`PerfAnalyzerUnavailable`
    with the reason and the fix.
    """
    given = os.environ.get("CORRAL_PERF_ANALYZER")
    if given:
        found = PerfAnalyzer(Path(given), dict(os.environ), "$CORRAL_PERF_ANALYZER")
        return _started(found)
    wanted = pins(glibc_version())
    venv = cache / "perf-analyzer"
    cache.mkdir(parents=True, exist_ok=True)
    with _held(cache / "perf-analyzer.lock"):
        try:
            python = install_venv(venv, wanted)
        except PeerUnavailable as exc:
            raise PerfAnalyzerUnavailable(
                f"perf_analyzer's venv {venv} could not be made ({' '.join(wanted)}): {exc}"
            ) from exc
    binary = python.parent / "perf_analyzer"
    if not binary.exists():
        raise PerfAnalyzerUnavailable(f"{' '.join(wanted)} brought no perf_analyzer in {venv}")
    return _started(PerfAnalyzer(binary, _environment(python), " ".join(wanted)))


def _environment(python: Path) -> dict[str, str]:
    """The environment of this process, the venv's CUDA runtime library on the loader's path."""
    env = dict(os.environ)
    found = subprocess.run(
        [str(python), "-c", _CUDA_LIBRARY],
        capture_output=True,
        text=True,
        timeout=_START_TIMEOUT_S,
        check=False,
    )
    libraries = [line for line in found.stdout.splitlines() if line]
    if libraries:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            [*libraries, *filter(None, [env.get("LD_LIBRARY_PATH")])]
        )
    return env


# Run by the venv's python: the folders of the nvidia-cuda-runtime-cu12 wheel's libcudart.
_CUDA_LIBRARY = """
import importlib.util, pathlib
spec = importlib.util.find_spec("nvidia.cuda_runtime")
for path in (spec.submodule_search_locations if spec else None) or []:
    print(pathlib.Path(path) / "lib")
"""


def _started(found: PerfAnalyzer) -> PerfAnalyzer:
    """``found`` once its ``--version`` ran; else :class:`PerfAnalyzerUnavailable`, saying why."""
    try:
        started = subprocess.run(
            [str(found.binary), "--version"],
            capture_output=True,
            text=True,
            env=found.environment,
            timeout=_START_TIMEOUT_S,
            check=False,
        )
    except OSError as exc:
        raise PerfAnalyzerUnavailable(f"{found.binary} cannot be run: {exc}") from exc
    if started.returncode != 0:
        said = (started.stderr or started.stdout).strip()[:300]
        raise PerfAnalyzerUnavailable(
            f"{found.binary} ({found.source}) does not start: {said} (make tools installs "
            "Debian's libb64-0d, which tritonclient's binary needs)"
        )
    return found


@contextlib.contextmanager
def _held(lock: Path) -> Iterator[None]:
    """An exclusive lock on ``lock``: two test runs never make the one venv at once."""
    with lock.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


if __name__ == "__main__":
    try:
        made = perf_analyzer()
    except PerfAnalyzerUnavailable as exc:
        sys.exit(f"perf_analyzer: {exc}")
    print(f"{made.binary} ({made.source})")
