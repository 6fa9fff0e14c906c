"""Servers the benchmarks start: each in a session of its own, stopped by its process id.

A server started here gets its own session (a terminal's Ctrl-C reaches only the benchmark,
whose ``finally`` blocks stop it), and on Linux the kernel sends it SIGTERM should the
benchmark die without them (SIGKILL). :func:`stop_process` sends SIGTERM and, past a bound,
SIGKILL.
"""

from __future__ import annotations

import ctypes
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["STOP_TIMEOUT_S", "die_with_parent", "start_process", "stop_process"]

#: Seconds a server has to exit after SIGTERM before it is killed.
STOP_TIMEOUT_S = 10.0


def die_with_parent() -> None:
    """A ``preexec_fn``: the kernel sends the server SIGTERM when the benchmark dies (Linux).

    Runs in the child between fork and exec: if the benchmark dies without its finally blocks
    (SIGKILL), none of its servers is left behind.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, signal.SIGTERM)


def start_process(
    argv: Sequence[str],
    log: Path,
    env: dict[str, str] | None = None,
    *,
    own_session: bool = True,
) -> subprocess.Popen[bytes]:
    """Start a server writing to ``log``, with ``env`` (None: this process's).

    In a session of its own unless ``own_session`` is false: a terminal's Ctrl-C then reaches
    only the benchmark. (A session is also a scheduling group of its own under the kernel's
    autogroup scheduling: ``benchmarks/reuseport.py`` keeps its servers in its own session.)
    """
    with log.open("wb") as out:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=own_session,
            preexec_fn=die_with_parent if sys.platform == "linux" else None,
        )


def stop_process(process: subprocess.Popen[bytes], timeout: float = STOP_TIMEOUT_S) -> int:
    """SIGTERM ``process`` by its pid and wait; SIGKILL it if it has not exited in ``timeout``."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            print(
                f"pid {process.pid} did not exit {timeout:.0f} s after SIGTERM: SIGKILL",
                file=sys.stderr,
            )
            process.kill()
            process.wait()
    return process.returncode
