"""The measuring child: loads model versions alone and reports what each copy costs.

Run by :class:`corral._host.charges.ChargeMeter` as ``python -m corral._host.charge_child``,
one process per Host at most, at a lowered priority (``os.nice``). It talks over two file
descriptors given on its command line, in :class:`multiprocessing.connection.Connection`
frames holding JSON (no pickle): first the Runtime's options, then one job per model
version, each answered before the next is read.

A job names a model file, the session settings the Host built it with and a number of
copies. The child loads one copy and closes it (what the first session of a kind costs once
per process, and the load's transient peak, stay out of the measure), asks the C allocator
to give back what it holds free, reads its resident size and the allocator's bytes in use,
loads the copies and reads both again. The answer is the growth per copy (the parent
charges the bytes in use: ``corral._host.charges``):
``{"resident": bytes, "in_use": bytes or null}``, or ``{"error": text}``. The copies are
closed before the next job.

Standard output is pointed at standard error first: onnxruntime and Python write there,
never into the frames.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import json
import os
import sys
from multiprocessing.connection import Connection
from typing import Any

from corral._compute import Runtime, RuntimeOptions, Session
from corral._host.machine_memory import give_back_freed_memory

__all__ = ["CHILD_NICENESS", "main", "measure", "resident_bytes"]

#: How much lower the child's scheduling priority is than the server's (``os.nice``): its
#: loads take a core only when requests leave one.
CHILD_NICENESS = 10


def resident_bytes() -> int:
    """The resident set size of the calling process, from ``/proc/self/statm`` (Linux)."""
    with open("/proc/self/statm", "rb") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


@functools.cache
def _mallinfo2() -> Any:
    try:
        function = ctypes.CDLL(None).mallinfo2
    except (AttributeError, OSError):
        return None  # not glibc 2.33 or later: the bytes in use are not reported
    function.restype = _MallInfo2
    return function


def _in_use_bytes() -> int | None:
    """Bytes the C allocator has handed out and not had back (glibc's mallinfo2)."""
    mallinfo2 = _mallinfo2()
    if mallinfo2 is None:
        return None
    info = mallinfo2()
    return int(info.uordblks + info.hblkhd)


def _settled() -> tuple[int, int | None]:
    gc.collect()
    give_back_freed_memory()
    return resident_bytes(), _in_use_bytes()


def measure(runtime: Runtime, path: str, settings: dict[str, Any], copies: int) -> dict[str, Any]:
    """The growth per loaded copy of the model at ``path``: resident bytes and bytes in use."""
    Session(path, runtime=runtime, **settings).close()
    resident, in_use = _settled()
    sessions = []
    try:
        for _ in range(copies):
            sessions.append(Session(path, runtime=runtime, **settings))
        resident_after, in_use_after = _settled()
    finally:
        for session in sessions:
            session.close()
    return {
        "resident": max(0, resident_after - resident) // copies,
        "in_use": (
            None
            if in_use is None or in_use_after is None
            else max(0, in_use_after - in_use) // copies
        ),
    }


def _session_settings(settings: dict[str, Any]) -> dict[str, Any]:
    # JSON has no tuples: the session config's pairs come back as lists.
    chosen = dict(settings)
    chosen["session_config"] = tuple(tuple(pair) for pair in settings.get("session_config", ()))
    return chosen


def serve(jobs: Connection, answers: Connection) -> None:
    """Answer jobs from ``jobs`` on ``answers`` until ``jobs`` closes."""
    first = json.loads(jobs.recv_bytes())
    runtime = Runtime.from_options(RuntimeOptions(**first["runtime"]))
    while True:
        try:
            job = json.loads(jobs.recv_bytes())
        except EOFError:
            return
        try:
            answer = measure(
                runtime, job["path"], _session_settings(job["settings"]), int(job["copies"])
            )
        except Exception as exc:  # the answer: the parent keeps the estimate and says why
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        answers.send_bytes(json.dumps(answer).encode())


def main(argv: list[str] | None = None) -> int:
    """``python -m corral._host.charge_child JOBS_FD ANSWERS_FD``."""
    jobs_fd, answers_fd = (int(part) for part in (argv or sys.argv[1:]))
    os.dup2(2, 1)  # nothing but frames on the answers' descriptor
    os.nice(CHILD_NICENESS)
    serve(Connection(jobs_fd, writable=False), Connection(answers_fd, readable=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
